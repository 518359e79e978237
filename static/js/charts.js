// Charts of values per UTC day, drawn with uPlot (static/vendor/uplot.js, copied there by
// `make console-libs`; docs/console.md, "Charts"). One call makes one chart that:
//
// - takes its colours from the theme: each series names a CSS variable (`--chart-1`…, console.css),
//   resolved through a probe element, since the variables hold `light-dark()` pairs that only a
//   computed `color` turns into the one colour the page shows now;
// - is drawn again when the theme changes (the theme button's `data-theme`, or the system's
//   scheme while the theme follows it), and takes its box's width when the page is resized;
// - keeps its uPlot instance on its element (`element.uplot`): the data it holds, for the
//   browser tests (docs/console.md, "Browser tests and screenshots").
//
// uPlot draws on a <canvas> and sets sizes through the CSSOM (`el.style.x = …`), which the
// console's Content-Security-Policy allows; it adds no <style> and no inline script.
import uPlot from "/vendor/uplot.js";
import { h } from "./ui.js";

const DAY_S = 86400;
// Days on the x axis: one tick per day at most, then every 2, 7, 14, 30 days as the width asks.
const DAY_TICKS = [1, 2, 7, 14, 30, 60, 90].map((n) => n * DAY_S);
// Counts on the y axis are whole numbers: no tick at 0.5.
const COUNT_TICKS = [1, 2, 5].flatMap((n) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10].map((p) => n * p))
  .sort((a, b) => a - b);
const dayFormat = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", timeZone: "UTC" });

// "2026-12-02" → seconds since the epoch at that UTC midnight (uPlot's time scale is in seconds).
export function dayToSeconds(day) {
  const [y, m, d] = day.split("-").map(Number);
  return Date.UTC(y, m - 1, d) / 1000;
}

export function compactNumber(value) {
  if (value === null || value === undefined) return "—";
  return Math.abs(value) >= 10_000
    ? new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 }).format(value)
    : value.toLocaleString();
}

// The colour a CSS value resolves to here and now ("var(--chart-1)" → "rgb(36, 87, 214)").
function resolve(probe, value) {
  probe.style.color = value;
  return getComputedStyle(probe).color;
}

function withAlpha(rgb, alpha) {
  const parts = rgb.match(/[\d.]+/g) || ["0", "0", "0"];
  return `rgba(${parts[0]}, ${parts[1]}, ${parts[2]}, ${alpha})`;
}

function options(box, probe, { series, height }) {
  const ink = resolve(probe, "var(--chart-axis)");
  const grid = resolve(probe, "var(--chart-grid)");
  const axis = {
    stroke: ink,
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid, width: 1 },
  };
  return {
    width: Math.max(200, box.clientWidth),
    height,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    scales: {
      // Half a day of room on each side, so the first and last bars are whole.
      x: { time: true, range: (u, min, max) => [min - DAY_S / 2, max + DAY_S / 2] },
      y: { range: (u, min, max) => uPlot.rangeNum(0, Math.max(1, max), 0.1, true) },
    },
    axes: [
      { ...axis, incrs: DAY_TICKS, space: 48, values: (u, splits) => splits.map((s) => dayFormat.format(s * 1000)) },
      { ...axis, incrs: COUNT_TICKS, size: 56, values: (u, splits) => splits.map(compactNumber) },
    ],
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    series: [
      { label: "Day", value: (u, ts) => (ts === null || ts === undefined ? "—" : dayFormat.format(ts * 1000)) },
      ...series.map((s) => {
        const colour = resolve(probe, `var(${s.colour})`);
        const common = { label: s.label, stroke: colour, value: (u, v) => compactNumber(v) };
        return s.kind === "bars"
          ? { ...common, width: 0, fill: withAlpha(colour, 0.75), paths: uPlot.paths.bars({ size: [0.7, 48] }), points: { show: false } }
          : { ...common, width: 2, points: { show: true, size: 6, fill: colour } };
      }),
    ],
  };
}

// A chart in `box` (an element already in the page, sized by CSS): `data` is uPlot's columns,
// [x seconds[], series 1[], …], `series` [{label, colour: "--chart-1", kind: "bars" | "line"}].
// Returns {element, destroy()}; `page.cleanup` should call destroy.
export function dayChart(box, { series, data, height = 220 }) {
  const probe = h("span.chart-probe", { "aria-hidden": "true" });
  box.append(probe);
  let chart = null;
  const draw = () => {
    if (chart) chart.destroy();
    chart = new uPlot(options(box, probe, { series, height }), data, box);
    box.uplot = chart;
  };
  draw();
  let width = box.clientWidth;
  const resized = new ResizeObserver(() => {
    if (!chart || box.clientWidth === width || !box.clientWidth) return;
    width = box.clientWidth;
    chart.setSize({ width: Math.max(200, width), height });
  });
  resized.observe(box);
  const themed = new MutationObserver(draw);
  themed.observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
  const scheme = matchMedia("(prefers-color-scheme: dark)");
  scheme.addEventListener("change", draw);
  return {
    element: box,
    destroy() {
      resized.disconnect();
      themed.disconnect();
      scheme.removeEventListener("change", draw);
      if (chart) chart.destroy();
      chart = null;
      delete box.uplot;
    },
  };
}
