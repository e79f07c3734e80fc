// Shared by the dashboard and the lab: chart sizing, number formatting, the palette.
"use strict";
const RL = {
  colours: { allow: "#0072B2", deny: "#D55E00", state: "#009E73", expect: "#000000", warn: "#E69F00",
             sources: ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9"] },
  fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    const d = digits === undefined ? (Math.abs(x) >= 100 ? 0 : 1) : digits;
    return Number(x).toLocaleString("en", { maximumFractionDigits: d, minimumFractionDigits: 0 });
  },
  // Width available to a chart inside `el`.
  width(el) { return Math.max(260, Math.floor(el.getBoundingClientRect().width) - 4); },
  // Resizes every chart in `charts` ([uPlot, container]) on window resize.
  resizing(charts) {
    let pending = null;
    window.addEventListener("resize", () => {
      clearTimeout(pending);
      pending = setTimeout(() => charts.forEach(([u, el]) => u.setSize({ width: RL.width(el), height: u.height })), 100);
    });
  },
  el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  },
};
