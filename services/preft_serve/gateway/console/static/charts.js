// Charts drawn as SVG node by node (labels are text nodes; no markup from strings).

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  if (text !== undefined) el.textContent = text;
  return el;
}

/** Bars, one per point ``{label, value}``. */
export function barChart(label, points) {
  const width = 640;
  const height = 160;
  const max = Math.max(1, ...points.map((p) => p.value));
  const step = width / Math.max(1, points.length);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height + 20}`, role: "img", "aria-label": label, class: "chart" });
  points.forEach((p, i) => {
    const tall = (p.value / max) * height;
    const bar = svg("rect", { class: "bar", x: i * step + 2, y: height - tall, width: Math.max(1, step - 4), height: tall });
    bar.append(svg("title", {}, `${p.label}: ${p.value}`));
    chart.append(bar);
  });
  if (points.length) {
    chart.append(svg("text", { x: 0, y: height + 16, "font-size": 12 }, points[0].label));
    chart.append(svg("text", { x: width, y: height + 16, "font-size": 12, "text-anchor": "end" }, points[points.length - 1].label));
  }
  return chart;
}

/** A line through points ``{x, y}`` (x ascending), with a dot and a tooltip per point. */
export function lineChart(label, points) {
  const width = 640;
  const height = 200;
  const pad = 36;
  const xs = points.map((p) => p.x);
  const ys = points.map((p) => p.y);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x) => pad + ((x - x0) / Math.max(1e-9, x1 - x0)) * (width - 2 * pad);
  const sy = (y) => height - pad - ((y - y0) / Math.max(1e-9, y1 - y0)) * (height - 2 * pad);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, class: "chart" });
  chart.append(svg("polyline", { class: "line", points: points.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" ") }));
  for (const p of points) {
    const dot = svg("circle", { class: "dot", cx: sx(p.x), cy: sy(p.y), r: 3 });
    dot.append(svg("title", {}, `step ${p.x}: ${p.y.toFixed(4)}`));
    chart.append(dot);
  }
  chart.append(svg("text", { x: 2, y: 14, "font-size": 12 }, y1.toFixed(3)));
  chart.append(svg("text", { x: 2, y: height - pad, "font-size": 12 }, y0.toFixed(3)));
  chart.append(svg("text", { x: pad, y: height - 8, "font-size": 12 }, `step ${x0}`));
  chart.append(svg("text", { x: width - pad, y: height - 8, "font-size": 12, "text-anchor": "end" }, `step ${x1}`));
  return chart;
}
