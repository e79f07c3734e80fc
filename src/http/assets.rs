//! The pages and their assets, compiled into the binary (`include_bytes!`), so the
//! dashboard and the lab work with no network and load nothing from another origin.
//! Each page is sent with a Content-Security-Policy that allows this origin only.
//! The files live in `src/http/assets/` (its README says where uPlot comes from).

use super::{text, Body};
use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::{Response, StatusCode};

/// One file served at a path.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The URL path.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

/// What a page may load: this origin only (inline styles: uPlot sizes its elements).
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

macro_rules! asset {
    ($path:literal, $type:expr, $file:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("assets/", $file)),
        }
    };
}

/// Every file served; `/lab` is routed only when the lab is on (`super::route`).
pub const ALL: [Asset; 10] = [
    asset!("/", HTML, "index.html"),
    asset!("/lab", HTML, "lab.html"),
    asset!("/assets/style.css", CSS, "style.css"),
    asset!("/assets/common.js", JS, "common.js"),
    asset!("/assets/dashboard.js", JS, "dashboard.js"),
    asset!("/assets/lab.js", JS, "lab.js"),
    asset!("/assets/uPlot.iife.min.js", JS, "uPlot.iife.min.js"),
    asset!("/assets/uPlot.min.css", CSS, "uPlot.min.css"),
    asset!(
        "/assets/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        "uPlot.LICENSE"
    ),
    asset!("/favicon.svg", "image/svg+xml", "favicon.svg"),
];

/// The asset served at `path`, if any.
pub fn find(path: &str) -> Option<&'static Asset> {
    ALL.iter().find(|a| a.path == path)
}

impl Asset {
    /// `200` with the file, its type and the page policy.
    pub fn response(&self) -> Response<Body> {
        let mut r = text(StatusCode::OK, self.content_type, self.body);
        let h = r.headers_mut();
        h.insert("content-security-policy", HeaderValue::from_static(CSP));
        h.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }
}
