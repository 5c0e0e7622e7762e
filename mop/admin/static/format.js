// How the dashboard writes numbers, sizes, rates and durations (in the browser's locale).

const whole = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const oneDecimal = new Intl.NumberFormat(undefined, {
  minimumFractionDigits: 1,
  maximumFractionDigits: 1,
});
const compact = new Intl.NumberFormat(undefined, {
  notation: "compact",
  maximumFractionDigits: 1,
});

/** A count: 1,234,567. */
export function count(value) {
  return Number.isFinite(value) ? whole.format(value) : "—";
}

/** A rate per second: one decimal below 10, whole numbers up to 100,000, then 1.2M. */
export function rate(value) {
  if (!Number.isFinite(value)) return "—";
  if (value === 0) return "0";
  if (value < 10) return oneDecimal.format(value);
  if (value < 100_000) return whole.format(value);
  return compact.format(value);
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/** A size in bytes with binary units: 512 B, 1.5 MiB. */
export function bytes(value) {
  if (!Number.isFinite(value)) return "—";
  let unit = 0;
  let scaled = value;
  while (scaled >= 1024 && unit < BYTE_UNITS.length - 1) {
    scaled /= 1024;
    unit += 1;
  }
  const number = unit === 0 ? whole.format(scaled) : oneDecimal.format(scaled);
  return `${number} ${BYTE_UNITS[unit]}`;
}

/** A duration in seconds, to its two largest units: 45 s, 12 min 5 s, 3 h 20 min, 2 d 4 h. */
export function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "—";
  const s = Math.floor(seconds);
  const parts = [
    [Math.floor(s / 86400), "d"],
    [Math.floor(s / 3600) % 24, "h"],
    [Math.floor(s / 60) % 60, "min"],
    [s % 60, "s"],
  ];
  const first = parts.findIndex(([amount]) => amount > 0);
  if (first === -1) return "0 s";
  return parts
    .slice(first, first + 2)
    .filter(([amount], index) => index === 0 || amount > 0)
    .map(([amount, unit]) => `${amount} ${unit}`)
    .join(" ");
}

/** How long ago a Unix time (seconds) was, from the browser's clock: "5 min ago". */
export function ago(unixSeconds, nowMillis = Date.now()) {
  const seconds = Math.max(0, nowMillis / 1000 - unixSeconds);
  return seconds < 5 ? "just now" : `${duration(seconds)} ago`;
}

/** A Unix time (seconds) as a local date and time, for tooltips. */
export function dateTime(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleString();
}

/** A clock time for "updated at" notes: 14:03:27. */
export function clockTime(date) {
  return date.toLocaleTimeString();
}
