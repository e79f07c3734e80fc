// The rule lab: builds a run from the form, opens /lab/events (the run lasts as long
// as the stream), draws every decision, and sets expected figures beside measured ones.
// Expected figures come from a fluid model of the algorithm fed with the profile's rate
// (requests as a continuous flow, 1 ms steps); for a steady rate it equals the closed
// form the page states.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const form = $("form"), status = $("status");
  const PRESETS = {
    "mobile-burst": { algorithm: "token_bucket", capacity: 20, refill_rate: 10, profile: "bursty", rate: 1, peak: 16, period_ms: 4000, seconds: 20, clients: 1 },
    "shaping": { algorithm: "leaky_bucket", capacity: 10, leak_rate: 5, profile: "poisson", rate: 8, seconds: 15, clients: 1 },
    "edge-spike": { algorithm: "fixed_window", limit: 10, window: "1s", profile: "bursty", rate: 0.5, peak: 40, period_ms: 2000, seconds: 20, clients: 1 },
    "exactness": { algorithm: "sliding_window_log", limit: 10, window: "1s", profile: "bursty", rate: 0.5, peak: 40, period_ms: 2000, seconds: 20, clients: 1 },
    "counter-error": { algorithm: "sliding_window_counter", limit: 10, window: "1s", profile: "bursty", rate: 0.5, peak: 40, period_ms: 2000, seconds: 20, clients: 1 },
    "littles-law": { algorithm: "concurrency", limit: 5, max_hold: "30s", hold_ms: 500, profile: "steady", rate: 20, seconds: 10, clients: 1 },
  };
  const STATE = {
    token_bucket: "tokens in the bucket (= remaining)",
    leaky_bucket: "queue level (= limit − remaining)",
    fixed_window: "count in the current window (= limit − remaining)",
    sliding_window_log: "log size: units admitted in the last window (= limit − remaining)",
    sliding_window_counter: "estimated count (= limit − remaining)",
    concurrency: "slots in use after each ACQUIRE (= limit − remaining)",
  };
  let budget = { max_rps: 500, max_seconds: 60, max_keys: 100, prefix: "" };
  let source = null, run = null;

  // ---- the form ----
  function value(name) { return form.elements[name].value; }
  function num(name) { return Number(value(name)); }
  function showFields() {
    const a = value("algorithm"), p = value("profile");
    document.querySelectorAll("fieldset[data-for]").forEach((f) => { f.hidden = !f.dataset.for.split(" ").includes(a); });
    document.querySelectorAll("label[data-for], input[data-for], select[data-for]").forEach((e) => { e.hidden = !e.dataset.for.split(" ").includes(a); });
    document.querySelectorAll("[data-profile]").forEach((e) => { e.hidden = !e.dataset.profile.split(" ").includes(p); });
    $("state-what").textContent = STATE[a];
    explain(planFromForm(), 0);
  }
  function applyPreset(name) {
    const p = PRESETS[name];
    if (!p) return;
    for (const [k, v] of Object.entries(p)) if (form.elements[k]) form.elements[k].value = v;
    form.elements.preset.value = name;
    showFields();
  }
  function planFromForm() {
    const a = value("algorithm");
    const plan = { algorithm: a, profile: value("profile"), rate: num("rate"), peak: Math.max(num("peak"), num("rate")),
                   period_ms: Math.max(100, num("period_ms")), duration_ms: num("seconds") * 1000, clients: num("clients") };
    if (a === "token_bucket") Object.assign(plan, { capacity: num("capacity"), refill_rate: num("refill_rate") });
    else if (a === "leaky_bucket") Object.assign(plan, { capacity: num("capacity"), leak_rate: num("leak_rate") });
    else if (a === "concurrency") Object.assign(plan, { limit: num("limit"), max_hold_ms: windowMs(value("max_hold")), hold_ms: num("hold_ms") });
    else Object.assign(plan, { limit: num("limit"), window_ms: windowMs(value("window")) });
    return plan;
  }
  function windowMs(w) { const m = /^(\d+)(ms|s|m)$/.exec(w); return m ? Number(m[1]) * { ms: 1, s: 1000, m: 60000 }[m[2]] : 1000; }
  function query(plan) {
    const q = new URLSearchParams({ algorithm: plan.algorithm, profile: plan.profile, rate: plan.rate, peak: plan.peak,
      period_ms: plan.period_ms, seconds: plan.duration_ms / 1000, clients: plan.clients });
    if (plan.capacity !== undefined) q.set("capacity", plan.capacity);
    if (plan.refill_rate !== undefined) q.set("refill_rate", plan.refill_rate);
    if (plan.leak_rate !== undefined) q.set("leak_rate", plan.leak_rate);
    if (plan.hold_ms !== undefined) { q.set("limit", plan.limit); q.set("max_hold", value("max_hold")); q.set("hold_ms", plan.hold_ms); }
    else if (plan.limit !== undefined) { q.set("limit", plan.limit); q.set("window", value("window")); }
    return q.toString();
  }

  // ---- the model (same profile as the daemon's plan) ----
  function rateAt(plan, t) {
    if (plan.profile === "bursty") return (t % plan.period_ms) < plan.period_ms / 2 ? plan.peak : plan.rate;
    if (plan.profile === "surge") return plan.rate + (plan.peak - plan.rate) * t / plan.duration_ms;
    return plan.rate;
  }
  // How long a slot stays taken: the hold time, cut short by max_hold.
  function slotMs(plan) { return Math.max(1, Math.min(plan.hold_ms, plan.max_hold_ms)); }
  function policyWindow(plan) {
    if (plan.hold_ms) return slotMs(plan);
    if (plan.window_ms) return plan.window_ms;
    const r = plan.refill_rate || plan.leak_rate;
    return Math.ceil(1000 * plan.capacity / r);
  }
  // One client's fluid run: accepted per ms, from `startedMs` (windows are aligned to
  // the Unix epoch, so the run's phase in its first window matters).
  function fluid(plan, startedMs) {
    const T = plan.duration_ms, acc = new Float64Array(T);
    let arrivals = 0;
    // A concurrency rule is a sliding log of its slots: each accepted request holds
    // one for the hold time, so at most `limit` were accepted in any hold-long span.
    const lim = plan.limit, W = plan.hold_ms ? slotMs(plan) : plan.window_ms;
    let tokens = plan.capacity, level = 0, count = 0, prev = 0, win = null;
    const ring = W ? new Float64Array(W) : null; let inLog = 0;
    for (let t = 0; t < T; t++) {
      const a = rateAt(plan, t) / 1000;
      arrivals += a;
      let ok = 0;
      switch (plan.algorithm) {
        case "token_bucket": tokens = Math.min(plan.capacity, tokens + plan.refill_rate / 1000); ok = Math.min(a, tokens); tokens -= ok; break;
        case "leaky_bucket": level = Math.max(0, level - plan.leak_rate / 1000); ok = Math.max(0, Math.min(a, plan.capacity - level)); level += ok; break;
        case "fixed_window": case "sliding_window_counter": {
          const now = startedMs + t, w = Math.floor(now / W);
          if (win === null) win = w;
          if (w !== win) { prev = w === win + 1 ? count : 0; count = 0; win = w; }
          const est = plan.algorithm === "fixed_window" ? count : prev * (1 - (now % W) / W) + count;
          ok = Math.max(0, Math.min(a, lim - est)); count += ok; break;
        }
        case "sliding_window_log": case "concurrency": { const i = t % W; inLog -= ring[i]; ok = Math.max(0, Math.min(a, lim - inLog)); ring[i] = ok; inLog += ok; break; }
      }
      acc[t] = ok;
    }
    return { arrivals, acc };
  }
  function maxInWindow(acc, W) {
    let s = 0, best = 0;
    for (let t = 0; t < acc.length; t++) { s += acc[t]; if (t >= W) s -= acc[t - W]; best = Math.max(best, s); }
    return best;
  }
  function explain(plan, startedMs) {
    const m = $("math"), f = fluid(plan, startedMs), n = plan.clients;
    const accepted = f.acc.reduce((x, y) => x + y, 0);
    const T = plan.duration_ms / 1000, r = plan.rate;
    let text;
    switch (plan.algorithm) {
      case "token_bucket":
        text = `Token bucket, capacity c = ${plan.capacity}, refill R = ${plan.refill_rate}/s, at a steady rate r: the bucket starts full, so a burst of c goes through at once; ` +
          `after it the accepted ceiling is min(r, R); over T seconds, accepted ≈ min(r·T, c + R·T) (r = ${r}/s, T = ${T} s: ${RL.fmt(Math.min(r * T, plan.capacity + plan.refill_rate * T))} per client).`;
        break;
      case "leaky_bucket":
        text = `Leaky bucket, queue c = ${plan.capacity}, leak L = ${plan.leak_rate}/s, at a steady rate r: the queue fills at r − L while r > L, then admits exactly L/s; ` +
          `accepted ≈ min(r·T, c + L·T) (r = ${r}/s, T = ${T} s: ${RL.fmt(Math.min(r * T, plan.capacity + plan.leak_rate * T))} per client), each ALLOW told to wait level ÷ L (shaping to a constant rate).`;
        break;
      case "fixed_window":
        text = `Fixed window, limit N = ${plan.limit} per W = ${plan.window_ms} ms (aligned to the epoch), at a steady rate r: each window admits min(r·W, N), so the ceiling is min(r, N/W) (r = ${r}/s: ${RL.fmt(Math.min(r, 1000 * plan.limit / plan.window_ms))}/s); ` +
          `but N at the end of one window and N at the start of the next make up to 2N = ${2 * plan.limit} in one W-long interval.`;
        break;
      case "sliding_window_log":
        text = `Sliding window log, limit N = ${plan.limit} per W = ${plan.window_ms} ms: exact; no W-long interval ever holds more than N admitted units. Steady r: ceiling min(r, N/W) = ${RL.fmt(Math.min(r, 1000 * plan.limit / plan.window_ms))}/s.`;
        break;
      case "concurrency": {
        const h = slotMs(plan) / 1000, L = plan.limit;
        text = `Concurrency, limit L = ${L} slots, each request holding its slot h = ${RL.fmt(h * 1000, 0)} ms before RELEASE (max_hold ${plan.max_hold_ms / 1000} s): ` +
          `by Little's law the offered concurrency is r·h (r = ${r}/s: ${RL.fmt(r * h)} per client). Below L every ACQUIRE is allowed; above it a slot frees every h, ` +
          `so for steady arrivals the accepted rate is about min(r, L ÷ h) = ${RL.fmt(Math.min(r, L / h))}/s per client, and no h-long span holds more than L accepted requests ` +
          `(a freed slot waits for the next arrival: steady arrivals every 1/r s count h as rounded up to a whole number of those gaps, and Poisson arrivals get somewhat fewer). Each request is an ACQUIRE and a RELEASE, two against the lab's budget.`;
        break;
      }
      default:
        text = `Sliding window counter, limit N = ${plan.limit} per W = ${plan.window_ms} ms: estimate = previous window's count × (1 − elapsed fraction) + current count. Steady r: ceiling min(r, N/W) = ${RL.fmt(Math.min(r, 1000 * plan.limit / plan.window_ms))}/s; ` +
          `bursts make the estimate wrong either way, so a W-long interval may hold somewhat more or fewer than N.`;
    }
    const profile = {
      steady: `This run: steady, ${r}/s per client.`,
      poisson: `This run: Poisson arrivals, mean ${r}/s per client.`,
      bursty: `This run: a square wave, ${plan.peak}/s for the first half of each ${plan.period_ms} ms period and ${r}/s for the second (mean ${RL.fmt((plan.peak + r) / 2)}/s) per client.`,
      surge: `This run: a surge from ${r}/s up to ${plan.peak}/s per client over the run.`,
    }[plan.profile];
    m.textContent = text + " " + profile + ` Expected figures (table) come from a fluid model of the algorithm fed with the profile's rate, for ${n} client(s).`;
    // Accepted per second over the second half of the run: for a steady rate, the
    // ceiling after the burst, min(r, R) (or min(r, N/W)).
    const half = Math.floor(f.acc.length / 2);
    const late = f.acc.subarray(half).reduce((x, y) => x + y, 0) / ((f.acc.length - half) / 1000);
    const e = { arrivals: f.arrivals * n, accepted: accepted * n, ceiling: late, peak: maxInWindow(f.acc, policyWindow(plan)) };
    e.rate = e.arrivals > 0 ? e.accepted / e.arrivals : 0;
    $("exp-arrivals").textContent = RL.fmt(e.arrivals, 0);
    $("exp-accepted").textContent = RL.fmt(e.accepted, 0);
    $("exp-rate").textContent = RL.fmt(100 * e.rate, 1) + " %";
    $("exp-rate").dataset.value = e.rate;
    $("exp-ceiling").textContent = RL.fmt(e.ceiling);
    $("exp-peak").textContent = RL.fmt(e.peak, 1);
    return e;
  }

  // ---- charts ----
  const flowEl = $("flow"), stateEl = $("state");
  const flowData = [[], [], []], stateData = [[], []];
  const flow = new uPlot({
    width: RL.width(flowEl), height: 220, scales: { x: { time: false } },
    axes: [{ label: "s since start" }, { label: "per 100 ms", size: 50 }],
    series: [{ label: "s" },
      { label: "accepted", stroke: RL.colours.allow, width: 2, paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "denied", stroke: RL.colours.deny, width: 2, dash: [6, 4], paths: uPlot.paths.stepped({ align: 1 }) }],
  }, flowData, flowEl);
  const state = new uPlot({
    width: RL.width(stateEl), height: 220, scales: { x: { time: false } },
    axes: [{ label: "s since start" }, { label: "units", size: 50 }],
    series: [{ label: "s" }, { label: "state", stroke: RL.colours.state, width: 2, points: { show: false } }],
  }, stateData, stateEl);
  RL.resizing([[flow, flowEl], [state, stateEl]]);

  // ---- a run ----
  function setStatus(text, error) { status.textContent = text; status.classList.toggle("error", !!error); }
  function stop(text, error) {
    if (source) { source.close(); source = null; }
    $("run").disabled = false; $("stop").disabled = true;
    setStatus(text, error);
  }
  function start(plan) {
    if (source) return;
    const bins = Math.ceil(plan.duration_ms / 100);
    flowData[0] = Array.from({ length: bins }, (_, i) => (i + 1) / 10);
    flowData[1] = new Array(bins).fill(0); flowData[2] = new Array(bins).fill(0);
    stateData[0] = []; stateData[1] = [];
    flow.setData(flowData); state.setData(stateData);
    ["got-decided", "got-accepted", "got-rate", "got-ceiling", "got-peak"].forEach((id) => { $(id).textContent = "–"; });
    run = { plan, decided: 0, accepted: 0, late: 0, lateAccepted: 0, acceptedAt: new Map(), sources: {}, log: [] };
    $("run").disabled = true; $("stop").disabled = false;
    setStatus("starting…");
    source = new EventSource("/lab/events?" + query(plan));
    source.addEventListener("start", (e) => {
      const s = JSON.parse(e.data);
      run.start = s;
      if (s.window_ms && plan.window_ms) plan.window_ms = s.window_ms;
      run.expected = explain(plan, s.started_ms);
      setStatus(`running ${s.arrivals} requests over ${s.duration_ms / 1000} s; keys ${s.prefix}{${s.rule}:c…}`);
    });
    source.onmessage = (e) => take(JSON.parse(e.data));
    source.addEventListener("done", (e) => {
      const d = JSON.parse(e.data);
      finish();
      stop(`done: ${d.decided} decisions, ${d.allowed} accepted`);
    });
    source.addEventListener("failed", (e) => stop(JSON.parse(e.data).message, true));
    source.onerror = () => { if (source) stop("the stream ended before the run did", true); };
  }
  function take(rows) {
    const p = run.plan, half = p.duration_ms / 2;
    for (const [t, c, ok, remaining, limit, src, wait] of rows) {
      run.decided++;
      const bin = Math.min(flowData[1].length - 1, Math.floor(t / 100));
      if (ok) { run.accepted++; flowData[1][bin]++; } else flowData[2][bin]++;
      if (t >= half) { run.late++; if (ok) run.lateAccepted++; }
      if (ok) { if (!run.acceptedAt.has(c)) run.acceptedAt.set(c, []); run.acceptedAt.get(c).push(t); }
      run.sources[src] = (run.sources[src] || 0) + 1;
      if (c === 0) {
        stateData[0].push(t / 1000);
        const used = limit - remaining;
        stateData[1].push(p.algorithm === "token_bucket" ? remaining : used);
      }
      run.log.push([t, c, ok, remaining, limit, src, wait]);
    }
    if (run.log.length > 20) run.log = run.log.slice(-20);
    flow.setData(flowData); state.setData(stateData);
    measured();
  }
  function measured() {
    $("got-decided").textContent = RL.fmt(run.decided, 0);
    $("got-accepted").textContent = RL.fmt(run.accepted, 0);
    const rate = run.decided ? run.accepted / run.decided : 0;
    $("got-rate").textContent = RL.fmt(100 * rate, 1) + " %";
    $("got-rate").dataset.value = rate;
    $("sources").textContent = "decided by: " + Object.entries(run.sources).map(([s, n]) => `${s} ${n}`).join(", ");
    const tb = document.querySelector("#log tbody");
    tb.replaceChildren(...run.log.slice().reverse().map((r) => {
      const tr = RL.el("tr");
      [RL.fmt(r[0], 1), "c" + r[1], r[2] ? "ALLOW" : "DENY", r[3], r[4], r[5], r[6]].forEach((x) => tr.appendChild(RL.el("td", {}, String(x))));
      return tr;
    }));
  }
  function finish() {
    const p = run.plan, half = p.duration_ms / 2000;
    $("got-ceiling").textContent = RL.fmt(run.lateAccepted / half / p.clients);
    const W = policyWindow(p);
    let best = 0;
    for (const ts of run.acceptedAt.values()) {
      let i = 0;
      for (let j = 0; j < ts.length; j++) { while (ts[j] - ts[i] >= W) i++; best = Math.max(best, j - i + 1); }
    }
    $("got-peak").textContent = RL.fmt(best, 0);
    measured();
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const plan = planFromForm();
    const top = Math.max(plan.rate, plan.peak) * plan.clients * (plan.hold_ms ? 2 : 1);
    if (top > budget.max_rps) { setStatus(`clients × highest rate${plan.hold_ms ? " × 2 (ACQUIRE and RELEASE)" : ""} = ${top}/s is above this lab's budget of ${budget.max_rps}/s (http.lab_max_rps)`, true); return; }
    start(plan);
  });
  $("stop").addEventListener("click", () => stop("stopped"));
  form.elements.algorithm.addEventListener("change", () => { form.elements.preset.value = ""; showFields(); });
  form.elements.profile.addEventListener("change", showFields);
  form.elements.preset.addEventListener("change", () => applyPreset(value("preset")));
  form.addEventListener("input", (e) => { if (e.target.name !== "preset") explain(planFromForm(), 0); });

  fetch("/lab/config").then((r) => r.json()).then((b) => {
    budget = b;
    $("budget").textContent = `Runs go to the configured Redis through the daemon's own scripts, under ${b.prefix} only; at most ${b.max_rps} requests/s, ${b.max_seconds} s and ${b.max_keys} clients per run, one run at a time.`;
  });
  const preset = new URLSearchParams(location.search).get("preset");
  if (preset && PRESETS[preset]) applyPreset(preset); else showFields();
})();
