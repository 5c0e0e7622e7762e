// A small line chart on a canvas: the last few minutes of one series, redrawn on every sample.
// Colours come from the canvas's CSS custom properties, so the stylesheet themes it.

// Seconds across the chart at least, however few samples there are yet.
const MINIMUM_SPAN = 60;

/** The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least `value`. */
function niceCeil(value) {
  if (value <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * power >= value) return step * power;
  }
  return 10 * power;
}

export class Chart {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {{windowSeconds: number, format: (v: number) => string, minimumScale: number}} options
   */
  constructor(canvas, { windowSeconds, format, minimumScale }) {
    this.canvas = canvas;
    this.windowSeconds = windowSeconds;
    this.format = format;
    this.minimumScale = minimumScale;
    // [seconds (the page's monotonic clock), value or null for a gap]
    this.samples = [];
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  /** Add a sample taken at `time` (seconds); `null` marks a gap (a failed poll). */
  push(time, value) {
    this.samples.push([time, value]);
    const oldest = time - this.windowSeconds - 5;
    while (this.samples.length > 2 && this.samples[1][0] < oldest) this.samples.shift();
    this.draw();
  }

  /** The largest value shown now (0 when there is none). */
  peak() {
    let peak = 0;
    for (const [, value] of this.samples) if (value !== null) peak = Math.max(peak, value);
    return peak;
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (width === 0 || height === 0) return;
    const pixels = [Math.round(width * ratio), Math.round(height * ratio)];
    if (canvas.width !== pixels[0] || canvas.height !== pixels[1]) {
      [canvas.width, canvas.height] = pixels;
    }
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);

    const style = getComputedStyle(canvas);
    const colour = (name) => style.getPropertyValue(name).trim();
    const top = 16;
    const bottom = height - 2;
    const scale = niceCeil(Math.max(this.peak(), this.minimumScale));
    const now = this.samples.length ? this.samples[this.samples.length - 1][0] : 0;
    // A fresh page spreads its first minute over the whole width, then the span grows.
    const oldest = this.samples.length ? this.samples[0][0] : now;
    const span = Math.min(this.windowSeconds, Math.max(MINIMUM_SPAN, now - oldest));
    const right = width - 3; // room for the dot on the newest sample
    const x = (time) => right - ((now - time) / span) * right;
    const y = (value) => bottom - (value / scale) * (bottom - top);

    // Guides at the top of the scale and half way, labelled at the left.
    context.strokeStyle = colour("--chart-grid");
    context.lineWidth = 1;
    context.setLineDash([3, 4]);
    for (const level of [scale, scale / 2]) {
      context.beginPath();
      context.moveTo(0, Math.round(y(level)) + 0.5);
      context.lineTo(width, Math.round(y(level)) + 0.5);
      context.stroke();
    }
    context.setLineDash([]);
    context.beginPath();
    context.moveTo(0, bottom + 0.5);
    context.lineTo(width, bottom + 0.5);
    context.stroke();
    context.fillStyle = colour("--chart-text");
    context.font = `11px ${style.fontFamily}`;
    context.textBaseline = "bottom";
    context.fillText(this.format(scale), 2, Math.round(y(scale)) - 2);

    // The series, one path per run of samples between gaps.
    const runs = [];
    let run = [];
    for (const [time, value] of this.samples) {
      if (value === null) {
        if (run.length) runs.push(run);
        run = [];
      } else {
        run.push([x(time), y(value)]);
      }
    }
    if (run.length) runs.push(run);

    for (const points of runs) {
      context.beginPath();
      context.moveTo(points[0][0], bottom);
      for (const [px, py] of points) context.lineTo(px, py);
      context.lineTo(points[points.length - 1][0], bottom);
      context.closePath();
      context.fillStyle = colour("--chart-fill");
      context.fill();

      context.beginPath();
      context.moveTo(...points[0]);
      for (const point of points.slice(1)) context.lineTo(...point);
      context.strokeStyle = colour("--chart-line");
      context.lineWidth = 1.75;
      context.lineJoin = "round";
      context.stroke();
    }
    const last = this.samples[this.samples.length - 1];
    if (last && last[1] !== null) {
      context.beginPath();
      context.arc(x(last[0]), y(last[1]), 2.5, 0, 2 * Math.PI);
      context.fillStyle = colour("--chart-line");
      context.fill();
    }
  }
}
