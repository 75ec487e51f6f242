// What the test files share: the server under test (from the environment
// tests/node_client.rs sets), fresh board names, a byte relay that loses a
// reply on cue, and a scripted stand-in server. Not a test file itself.

import assert from "node:assert/strict";
import { once } from "node:events";
import net from "node:net";

import { decode, encode } from "@msgpack/msgpack";

import { RankdError, connect } from "../index.js";

const env = (name) => process.env[name] || undefined;
export const ADDR = env("RANKD_ADDR");
export const CA = env("RANKD_TLS_CA");
export const WRITE_TOKEN = env("RANKD_WRITE_TOKEN");
export const READ_TOKEN = env("RANKD_READ_TOKEN");
export const CLIENT_CERT = env("RANKD_TLS_CLIENT_CERT");
export const CLIENT_KEY = env("RANKD_TLS_CLIENT_KEY");

export const NO_SERVER = ADDR ? false : "RANKD_ADDR (host:port of a running rankd) is not set";

/** [host, port] of `addr` (`[::1]:7070` too). */
export function splitAddr(addr) {
  const at = addr.lastIndexOf(":");
  return [addr.slice(0, at).replace(/^\[(.*)\]$/, "$1"), Number(addr.slice(at + 1))];
}

/**
 * A client of the server under test (or of `addr`, a relay to it), as the
 * environment configures it, `options` overriding.
 */
export function open(options = {}, addr = ADDR) {
  const [host, port] = splitAddr(addr);
  const defaults = { caFile: CA, certFile: CLIENT_CERT, keyFile: CLIENT_KEY, token: WRITE_TOKEN, timeoutMs: 10_000 };
  return connect(host, port, { ...defaults, ...options });
}

/** Runs `body` with a fresh client, destroyed afterwards. */
export async function withClient(body, options) {
  const client = await open(options);
  try {
    return await body(client);
  } finally {
    client.destroy();
  }
}

let boards = 0;
/** A board name no other test (or earlier run on the same server) uses. */
export const freshBoard = (what) => `node.${what}.${process.pid}.${Date.now().toString(36)}.${boards++}`;

/** Asserts that `promise` rejects with a RankdError of `code`. */
export async function rejectsWithCode(promise, code) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof RankdError, `expected a RankdError, got ${err}`);
    assert.equal(err.code, code, `expected ${code}, got ${err.code}: ${err.msg}`);
    assert.equal(typeof err.msg, "string");
    return true;
  });
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** One frame: the 4-byte big-endian length and the msgpack of `value`. */
export function frame(value) {
  const body = encode(value, { useBigInt64: true });
  const header = Buffer.alloc(4);
  header.writeUInt32BE(body.length);
  return Buffer.concat([header, body]);
}

/** A `wid` as the client makes them: 32 random hex digits. */
export const WID = /^[0-9a-f]{32}$/;

/**
 * Relays TCP connections to `upstream` (host:port) byte for byte (so TLS
 * too). On cue it loses the server's next bytes on the newest connection:
 * `cutNextReply()` drops them and closes that connection (a connection lost
 * after the server applied a write), `holdReplies()` drops them and
 * everything after while the connection stays open (a reply that never
 * comes: the client times out).
 */
export class Relay {
  #server;
  #pairs = [];
  /** How many connections were accepted. */
  accepted = 0;

  async start(upstream = ADDR) {
    const [host, port] = splitAddr(upstream);
    this.#server = net.createServer((client) => {
      this.accepted++;
      const server = net.connect({ host, port });
      const pair = { client, server, mode: "relay" };
      this.#pairs.push(pair);
      client.on("data", (data) => server.write(data));
      server.on("data", (data) => {
        if (pair.mode === "relay") {
          client.write(data);
        } else if (pair.mode === "cut") {
          client.destroy();
          server.destroy();
        }
        // "hold": dropped
      });
      const end = () => {
        client.destroy();
        server.destroy();
      };
      for (const socket of [client, server]) {
        socket.on("error", end);
        socket.on("close", end);
      }
    });
    this.#server.listen(0, "127.0.0.1");
    await once(this.#server, "listening");
    this.addr = `127.0.0.1:${this.#server.address().port}`;
    return this;
  }

  #newest() {
    const pair = this.#pairs.at(-1);
    assert.ok(pair, "no connection to the relay yet");
    return pair;
  }

  cutNextReply() {
    this.#newest().mode = "cut";
  }

  holdReplies() {
    this.#newest().mode = "hold";
  }

  async stop() {
    for (const { client, server } of this.#pairs) {
      client.destroy();
      server.destroy();
    }
    this.#server.close();
    await once(this.#server, "close");
  }
}

/** One connection to a {@link FakeServer}: the requests it reads, and frames to answer with. */
export class FakeConnection {
  #socket;
  #buffer = Buffer.alloc(0);
  #requests = [];
  #waiters = [];
  closed = false;
  /** Resolves when the connection has closed (either side). */
  whenClosed;
  /** Every request read on this connection. */
  log = [];
  /** When each request of `log` arrived (`Date.now()`). */
  arrivals = [];

  constructor(socket) {
    this.#socket = socket;
    this.whenClosed = new Promise((resolve) => socket.once("close", resolve));
    socket.on("data", (data) => {
      this.#buffer = Buffer.concat([this.#buffer, data]);
      while (this.#buffer.length >= 4 && this.#buffer.length >= 4 + this.#buffer.readUInt32BE(0)) {
        const length = this.#buffer.readUInt32BE(0);
        const request = decode(this.#buffer.subarray(4, 4 + length));
        this.#buffer = this.#buffer.subarray(4 + length);
        this.log.push(request);
        this.arrivals.push(Date.now());
        const waiter = this.#waiters.shift();
        if (waiter) waiter(request);
        else this.#requests.push(request);
      }
    });
    socket.on("error", () => {});
    socket.on("close", () => {
      this.closed = true;
      for (const waiter of this.#waiters.splice(0)) waiter(undefined);
    });
  }

  /** The next request (`undefined` once the client has closed the connection). */
  read() {
    if (this.#requests.length > 0) return Promise.resolve(this.#requests.shift());
    if (this.closed) return Promise.resolve(undefined);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /** Writes frames of `messages` in one chunk. */
  send(...messages) {
    this.#socket.write(Buffer.concat(messages.map(frame)));
  }

  /** `{id, ok, ...extra}` for `request`. */
  reply(request, ok, extra = {}) {
    this.send({ id: request.id, ok, ...extra });
  }

  /** `{id, err: {code, msg}}` for `request`. */
  fail(request, code, msg = code) {
    this.send({ id: request.id, err: { code, msg } });
  }

  /** Closes the connection at once. */
  drop() {
    this.#socket.destroy();
  }
}

/**
 * A stand-in rankd on 127.0.0.1: each connection is handed to
 * `script(connection, index)` (0 for the first), which reads requests and
 * answers as the test needs.
 */
export class FakeServer {
  #server;
  #script;
  /** The connections accepted, in order. */
  connections = [];
  /** Errors thrown by the script. */
  errors = [];

  constructor(script) {
    this.#script = script;
  }

  async start() {
    this.#server = net.createServer((socket) => {
      const connection = new FakeConnection(socket);
      const index = this.connections.push(connection) - 1;
      Promise.resolve()
        .then(() => this.#script(connection, index))
        .catch((err) => {
          this.errors.push(err);
          connection.drop();
        });
    });
    this.#server.listen(0, "127.0.0.1");
    await once(this.#server, "listening");
    this.port = this.#server.address().port;
    return this;
  }

  /** Connects a client to it (no TLS, no token unless given). */
  connect(options = {}) {
    return connect("127.0.0.1", this.port, { timeoutMs: 5_000, ...options });
  }

  /**
   * Whether every connection accepted has closed, waiting up to `ms` for
   * them (the client closed its side: the server sees it a moment later).
   */
  async allClosed(ms = 1_000) {
    let timer;
    const timeout = new Promise((resolve) => (timer = setTimeout(resolve, ms)));
    await Promise.race([Promise.all(this.connections.map((connection) => connection.whenClosed)), timeout]);
    clearTimeout(timer);
    return this.connections.every((connection) => connection.closed);
  }

  async stop() {
    for (const connection of this.connections) connection.drop();
    this.#server.close();
    await once(this.#server, "close");
    assert.deepEqual(this.errors, [], "the fake server's script did not fail");
  }
}
