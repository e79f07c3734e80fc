// The live dashboard: one event a second from /events with the daemon's totals; rates
// are the difference between two events over the time between them.
"use strict";
(function () {
  const HISTORY = 300;
  const status = document.getElementById("status");
  const chartEl = document.getElementById("chart");
  const times = [], allowS = [], denyS = [];
  let prev = null;
  const chart = new uPlot({
    width: RL.width(chartEl), height: 220,
    // At least a minute wide, so the first points do not stretch over years.
    scales: { x: { time: true, range: (u, min, max) => [Math.min(min, max - 60), max] } },
    axes: [{}, { label: "decisions/s", size: 60 }],
    series: [
      { label: "time" },
      { label: "allowed/s", stroke: RL.colours.allow, width: 2 },
      { label: "denied/s", stroke: RL.colours.deny, width: 2, dash: [6, 4] },
    ],
  }, [times, allowS, denyS], chartEl);
  RL.resizing([[chart, chartEl]]);

  const sum = (a) => a.reduce((x, y) => x + y, 0);
  let headDone = false;

  function setText(id, text) { document.getElementById(id).textContent = text; }

  function head(sources) {
    if (headDone) return;
    const row = document.getElementById("rules-head");
    for (const s of sources) row.appendChild(RL.el("th", { scope: "col" }, s + "/s"));
    headDone = true;
  }

  function render(f) {
    head(f.sources);
    const dt = prev ? (f.at_ms - prev.at_ms) / 1000 : 0;
    const before = new Map(prev ? prev.rules.map((r) => [r.name, r]) : []);
    let allowRate = 0, denyRate = 0;
    const body = document.querySelector("#rules tbody");
    const rows = [];
    for (const r of f.rules) {
      const p = before.get(r.name);
      const perSource = r.allow.map((a, i) => (dt > 0 && p ? (a + r.deny[i] - p.allow[i] - p.deny[i]) / dt : null));
      const a = dt > 0 && p ? (sum(r.allow) - sum(p.allow)) / dt : null;
      const d = dt > 0 && p ? (sum(r.deny) - sum(p.deny)) / dt : null;
      if (a !== null) { allowRate += a; denyRate += d; }
      const tr = RL.el("tr", { "data-rule": r.name });
      const name = RL.el("th", { scope: "row" }, r.name);
      if (!r.configured) name.appendChild(RL.el("span", { class: "muted" }, " (envoy)"));
      tr.appendChild(name);
      tr.appendChild(RL.el("td", { "data-col": "allow" }, RL.fmt(a)));
      tr.appendChild(RL.el("td", { "data-col": "deny" }, RL.fmt(d)));
      const total = sum(r.allow) + sum(r.deny);
      tr.appendChild(RL.el("td", { "data-col": "ratio" }, total ? RL.fmt(100 * sum(r.deny) / total, 1) + " %" : "–"));
      tr.appendChild(RL.el("td", { "data-col": "total" }, RL.fmt(total, 0)));
      perSource.forEach((x, i) => tr.appendChild(RL.el("td", { "data-col": f.sources[i] }, RL.fmt(x))));
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    if (dt > 0) {
      times.push(f.at_ms / 1000); allowS.push(allowRate); denyS.push(denyRate);
      if (times.length > HISTORY) { times.shift(); allowS.shift(); denyS.shift(); }
      chart.setData([times, allowS, denyS]);
      setText("rate", RL.fmt(allowRate + denyRate));
      setText("deny-ratio", allowRate + denyRate > 0 ? RL.fmt(100 * denyRate / (allowRate + denyRate), 1) + " %" : "–");
    }
    setText("connections", RL.fmt(f.connections, 0));
    setText("leases", RL.fmt(f.leases_held, 0) + " (" + RL.fmt(f.lease_units, 0) + ")");
    setText("reloads", f.reloads_ok + " / " + f.reloads_rejected);
    setText("cache", RL.fmt(f.cache_entries, 0));
    setText("local", RL.fmt(f.local_keys, 0));
    hot(f.rules);
    primaries(f);
    prev = f;
  }

  function hot(rules) {
    const box = document.getElementById("hot");
    const parts = [];
    for (const r of rules) {
      if (!r.top.length) continue;
      const box = RL.el("div");
      box.appendChild(RL.el("h3", {}, r.name));
      const t = box.appendChild(RL.el("table"));
      const hr = RL.el("tr");
      ["key", "decisions", "±", "denied"].forEach((h) => hr.appendChild(RL.el("th", { scope: "col" }, h)));
      t.appendChild(RL.el("thead")).appendChild(hr);
      const tb = t.appendChild(RL.el("tbody"));
      for (const k of r.top) {
        const tr = RL.el("tr");
        tr.appendChild(RL.el("td", {}, k.key));
        tr.appendChild(RL.el("td", {}, RL.fmt(k.decisions, 0)));
        tr.appendChild(RL.el("td", {}, RL.fmt(k.max_error, 0)));
        tr.appendChild(RL.el("td", {}, RL.fmt(k.denies, 0)));
        tb.appendChild(tr);
      }
      parts.push(box);
    }
    if (!parts.length) parts.push(RL.el("p", { class: "muted" }, "none yet"));
    box.replaceChildren(...parts);
  }

  function primaries(f) {
    const tb = document.querySelector("#primaries tbody");
    if (!f.redis) {
      const tr = RL.el("tr");
      tr.appendChild(RL.el("td", { colspan: "2", class: "muted" }, "redis.mode = none: every decision is local"));
      tb.replaceChildren(tr);
      return;
    }
    tb.replaceChildren(...f.primaries.map((p) => {
      const tr = RL.el("tr", { "data-primary": p.name });
      tr.appendChild(RL.el("td", {}, p.name));
      tr.appendChild(RL.el("td", { class: p.open ? "open" : "ok" }, p.open ? "bypassed (decided locally)" : "healthy"));
      return tr;
    }));
  }

  const events = new EventSource("/events");
  events.onopen = () => { status.textContent = "live"; status.classList.remove("error"); };
  events.onmessage = (e) => render(JSON.parse(e.data));
  events.onerror = () => { status.textContent = "disconnected; reconnecting…"; status.classList.add("error"); };
})();
