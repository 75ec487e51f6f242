// Frames, the protocol's unit: a 4-byte big-endian length, then one msgpack
// map. Encoding requests into frames, and cutting the byte stream from the
// server back into decoded messages, however it is chunked.

import { Decoder, Encoder } from "@msgpack/msgpack";

import { RankdConnectionError } from "./errors.js";

/** The largest frame this client accepts from a server (64 MiB). */
export const MAX_FRAME = 64 * 1024 * 1024;

/**
 * Default for `maxFrame`, the largest request body the client sends: 1 MiB,
 * the server's default `max_frame` (a larger frame would make the server
 * answer `too_large` and close the connection).
 */
export const DEFAULT_MAX_FRAME = 1024 * 1024;

/**
 * The most bytes a request id takes in msgpack (a uint64). A request sent
 * again gets a new, larger id, which may take more bytes than the first.
 */
export const MAX_ID_BYTES = 9;

/** How many bytes msgpack takes for `n`, a non-negative integer (as the encoder writes it). */
export function uintBytes(n) {
  if (n < 0x80) return 1;
  if (n < 0x100) return 2;
  if (n < 0x1_0000) return 3;
  if (n < 0x1_0000_0000) return 5;
  return 9;
}

/** The length before each frame's body, in bytes. */
const HEADER = 4;

/** Makes frames of requests. One per client: it reuses its encoding buffer. */
export class FrameEncoder {
  #encoder = new Encoder({ useBigInt64: true });

  /** The frame of `value` (64-bit integers as `bigint`); throws if msgpack cannot hold it. */
  encode(value) {
    const body = this.#encoder.encodeSharedRef(value);
    const frame = Buffer.allocUnsafe(HEADER + body.length);
    frame.writeUInt32BE(body.length, 0);
    frame.set(body, HEADER);
    return frame;
  }
}

/** Reads the frames of one connection's byte stream (64-bit integers come as `bigint`). */
export class FrameReader {
  #decoder = new Decoder({ useBigInt64: true });
  #chunks = [];
  #buffered = 0;
  /** Bytes to gather before parsing again: a header, or the whole frame whose header is in. */
  #need = HEADER;

  /**
   * Takes the next `chunk` and hands each whole frame's message to
   * `onMessage`, in order, while it returns true (false: the connection
   * failed, the rest is dropped). Returns a {@link RankdConnectionError} if
   * the server broke the framing (nothing after it can be read), else
   * `undefined`.
   */
  read(chunk, onMessage) {
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    // Join the chunks only once a whole frame is there (a big frame arrives
    // in many chunks: joining at each one would be quadratic).
    if (this.#buffered < this.#need) return undefined;
    const buf = this.#chunks.length === 1 ? this.#chunks[0] : Buffer.concat(this.#chunks, this.#buffered);
    this.#chunks = [];
    this.#buffered = 0;
    let at = 0;
    while (buf.length - at >= HEADER) {
      const length = buf.readUInt32BE(at);
      if (length === 0 || length > MAX_FRAME) return badFrameLength(length);
      if (buf.length - at < HEADER + length) break;
      const body = buf.subarray(at + HEADER, at + HEADER + length);
      at += HEADER + length;
      let message;
      try {
        message = this.#decoder.decode(body);
      } catch (err) {
        return new RankdConnectionError(`undecodable frame from the server: ${err.message}`, { cause: err });
      }
      if (!onMessage(message)) return undefined;
    }
    const rest = at < buf.length ? buf.subarray(at) : undefined;
    if (rest) {
      this.#chunks = [rest];
      this.#buffered = rest.length;
    }
    this.#need = rest && rest.length >= HEADER ? HEADER + rest.readUInt32BE(0) : HEADER;
    return undefined;
  }

  /** Drops the bytes held (the connection failed). */
  clear() {
    this.#chunks = [];
    this.#buffered = 0;
  }
}

function badFrameLength(length) {
  return new RankdConnectionError(
    length === 0 ? "the server sent an empty frame" : `the server sent a frame of ${length} bytes, over the ${MAX_FRAME}-byte limit`,
  );
}
