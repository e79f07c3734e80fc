//! The routes without a socket: what each path answers, with and without the lab.

use super::*;
use crate::config::Config;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusBuilder;

fn state(lab: bool) -> Arc<State> {
    let text = format!(
        "[redis]\nmode = \"none\"\n[http]\nlisten = 9999\nlab = {lab}\n[[rule]]\nname = \"r\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n"
    );
    let config = Config::parse(&text, "t").unwrap();
    let handle = PrometheusBuilder::new().build_recorder().handle();
    let limiter = Arc::new(Limiter::local(&config));
    let lab = lab.then(|| lab::Lab::new(&config));
    Arc::new(State::new(&config.http, handle, limiter, None, lab))
}

fn get(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

async fn body_text(r: Response<Body>) -> String {
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The first event of a stream (its `retry:` line skipped).
async fn first_event(r: Response<Body>) -> String {
    let mut body = r.into_body();
    loop {
        let frame = body.frame().await.unwrap().unwrap();
        let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
        if !text.starts_with("retry:") {
            return text;
        }
    }
}

#[tokio::test]
async fn paths_answer_metrics_pages_assets_and_404_and_other_methods_405() {
    let s = state(false);
    let r = route(&get("/metrics"), &s);
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[CONTENT_TYPE], PROMETHEUS_TEXT);
    let r = route(&get("/"), &s);
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("default-src 'self'"));
    assert!(body_text(r).await.contains("live dashboard"));
    for path in ["/nope", "/lab", "/lab/events", "/lab/config", "/metrics/x"] {
        assert_eq!(
            route(&get(path), &s).status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let post = Request::builder()
        .method(Method::POST)
        .uri("/metrics")
        .body(())
        .unwrap();
    assert_eq!(route(&post, &s).status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_lab_is_served_only_with_lab_true() {
    let s = state(true);
    assert_eq!(route(&get("/lab"), &s).status(), StatusCode::OK);
    let config = body_text(route(&get("/lab/config"), &s)).await;
    assert!(
        config.contains("\"max_rps\":500") && config.contains("\"prefix\":\"rl:lab:\""),
        "{config}"
    );
}

#[tokio::test]
async fn the_dashboard_stream_sends_every_rule_and_the_lab_stream_every_decision() {
    let s = state(true);
    let r = route(&get("/events"), &s);
    assert_eq!(r.headers()[CONTENT_TYPE], "text/event-stream");
    let event = first_event(r).await;
    assert!(
        event.starts_with("data: {") && event.contains("\"name\":\"r\""),
        "{event}"
    );
    // mode = none: the lab's limiter decides locally; 20/s for 0.5 s against capacity 3.
    let q = "/lab/events?algorithm=token_bucket&capacity=3&refill_rate=1&profile=steady&rate=20&seconds=0.5";
    let text = body_text(route(&get(q), &s)).await;
    assert!(text.contains("event: start"), "{text}");
    let rows: usize = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: ["))
        .map(|l| l.matches("\"local\"").count())
        .sum();
    assert_eq!(rows, 10, "{text}");
    assert!(
        text.contains("event: done\ndata: {\"allowed\":3,\"decided\":10"),
        "{text}"
    );
    let bad = body_text(route(
        &get("/lab/events?algorithm=token_bucket&capacity=0&refill_rate=1"),
        &s,
    ))
    .await;
    assert!(
        bad.contains("event: failed") && bad.contains("capacity"),
        "{bad}"
    );
}

#[test]
fn every_asset_a_page_names_is_served_and_same_origin() {
    for page in ["/", "/lab"] {
        let html = std::str::from_utf8(assets::find(page).unwrap().body).unwrap();
        for attr in ["src=\"", "href=\""] {
            for part in html.split(attr).skip(1) {
                let url = &part[..part.find('"').unwrap()];
                assert!(
                    url.starts_with('/'),
                    "{page} names {url}: not a path of this origin"
                );
                let path = url.split('?').next().unwrap();
                assert!(
                    assets::find(path).is_some() || ["/metrics", "/lab"].contains(&path),
                    "{page} names {url}, which is not served"
                );
            }
        }
    }
}
