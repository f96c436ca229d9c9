// Numbers, durations and times as the views show them.

const whole = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
const one = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });

export function count(n) {
  return n === null || n === undefined ? "–" : whole.format(n);
}

export function rate(n) {
  if (n === null || n === undefined) return "–";
  return n >= 100 ? whole.format(n) : one.format(n);
}

export function ms(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1000) return `${whole.format(n)} ms`;
  if (n < 60_000) return `${one.format(n / 1000)} s`;
  return `${one.format(n / 60_000)} min`;
}

export function seconds(n) {
  return n === null || n === undefined ? "–" : ms(n * 1000);
}

export function clock(epochMs) {
  if (!epochMs) return "–";
  const at = new Date(epochMs);
  return at.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function ago(epochMs, now = Date.now()) {
  if (!epochMs) return "never";
  return `${ms(Math.max(0, now - epochMs))} ago`;
}

export function shortUrl(url) {
  return String(url).replace(/^https?:\/\//, "");
}

/** A key or value as the dead-letter view shows it: its text, else its base64. */
export function bytes(shown) {
  if (!shown || (shown.text === null && shown.base64 === null)) return "null";
  const text = shown.text !== null ? shown.text : `base64:${shown.base64}`;
  return shown.truncated ? `${text}… (${count(shown.bytes)} bytes)` : text;
}
