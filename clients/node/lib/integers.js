// 64-bit integers between msgpack and JavaScript, whose numbers are exact
// only up to 2^53 - 1: requests may hold a `bigint` anywhere, results hold a
// `number` when the value is a safe integer and a `bigint` otherwise.

const I64_MIN = -(2n ** 63n);
const U64_MAX = 2n ** 64n - 1n;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * A request value made ready for the encoder: integers beyond 32 bits become
 * `bigint` (the encoder, in BigInt mode, writes them as 64-bit integers; a
 * `number` there would go out as a float), and a `bigint` or `number` that
 * no 64-bit msgpack integer holds throws a RangeError instead of being
 * silently wrapped or rounded.
 */
export function toWire(value) {
  switch (typeof value) {
    case "number":
      if (Number.isInteger(value) && (value >= 2 ** 32 || value < -(2 ** 31))) {
        if (!Number.isSafeInteger(value)) {
          throw new RangeError(`${value} is beyond Number.MAX_SAFE_INTEGER and may have lost precision: pass a BigInt`);
        }
        return BigInt(value);
      }
      return value;
    case "bigint":
      if (value < I64_MIN || value > U64_MAX) throw new RangeError(`${value} does not fit in a 64-bit integer`);
      return value;
    case "object":
      if (value === null || ArrayBuffer.isView(value) || value instanceof Date) return value;
      if (Array.isArray(value)) return value.map(toWire);
      if (value instanceof Map) return new Map(Array.from(value, ([k, v]) => [k, toWire(v)]));
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toWire(v)]));
    default:
      return value;
  }
}

/** A decoded reply with every `bigint` that fits in a safe integer made a `number`. */
export function fromWire(value) {
  if (typeof value === "bigint") {
    return value >= MIN_SAFE && value <= MAX_SAFE ? Number(value) : value;
  }
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) value[i] = fromWire(value[i]);
    } else {
      for (const key of Object.keys(value)) value[key] = fromWire(value[key]);
    }
  }
  return value;
}
