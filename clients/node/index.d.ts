// Type definitions for rankd-client (hand-written; the code is index.js).

import { EventEmitter } from "node:events";
import { Duplex } from "node:stream";

/**
 * A 64-bit integer from the server: a `number` when it is a safe integer
 * (|n| <= 2^53 - 1), a `bigint` otherwise. Requests take either.
 */
export type Int64 = number | bigint;

/** The largest frame accepted from a server: 64 MiB. */
export const MAX_FRAME: number;
/** Default `timeoutMs`: 30 000. */
export const DEFAULT_TIMEOUT_MS: number;

export type ErrorCode =
  | "bad_frame"
  | "bad_request"
  | "unknown_op"
  | "too_large"
  | "conflict"
  | "unauthorized"
  | "overloaded"
  | "internal";

/** An error answered by the server (`{"err": {"code", "msg"}}`). */
export class RankdError extends Error {
  constructor(code: string, msg: string);
  readonly name: "RankdError";
  /** The protocol's error code. */
  readonly code: ErrorCode | (string & {});
  /** The server's explanation, for people. */
  readonly msg: string;
}

/**
 * The connection failed, timed out, was closed, or the server broke the
 * protocol; every request in flight rejects with it and the client is
 * unusable afterwards. The underlying error, if any, is its `cause`.
 */
export class RankdConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown });
  readonly name: "RankdConnectionError";
}

export interface ConnectOptions {
  /** Speak TLS, trusting the system's root certificates (implied by `caFile` or `certFile`). */
  tls?: boolean;
  /** A PEM file of the CA(s) to trust instead of the system's roots. */
  caFile?: string;
  /** The name the server's certificate must carry (and SNI); default: `host`. */
  serverName?: string;
  /** A PEM client certificate, for servers that require mutual TLS. */
  certFile?: string;
  /** The client certificate's PEM private key. */
  keyFile?: string;
  /** `auth` with this token right after connecting; `connect` rejects if it is refused. */
  token?: string;
  /** Bound on connecting and on waiting for each reply, ms (default 30 000; 0: none). */
  timeoutMs?: number;
}

export type Order = "desc" | "asc";
export type Ties = "competition" | "dense" | "ordinal";
export type Window = "all" | "daily" | "weekly" | "monthly";
export type Mode = "set" | "best" | "incr";

export interface BoardConfig {
  order?: Order;
  ties?: Ties;
  windows?: Window[];
  keep?: number;
  [field: string]: unknown;
}

export interface BoardInfo {
  board: string;
  order: Order;
  ties: Ties;
  windows: Window[];
  keep: number;
  /** Players in the first window's current period. */
  count: number;
  [field: string]: unknown;
}

export interface WriteOptions {
  mode?: Mode;
  [field: string]: unknown;
}

export interface ReadOptions {
  window?: Window;
  /** 0 (current, the default), -1 (previous), ... down to -keep. */
  period?: number;
  [field: string]: unknown;
}

export interface TopOptions extends ReadOptions {
  /** Default 10, at most 1000. */
  limit?: number;
  offset?: number;
}

export interface AroundOptions extends ReadOptions {
  /** Default 5, at most 500. */
  before?: number;
  /** Default 5, at most 500. */
  after?: number;
}

export interface Rank {
  rank: number;
  score: Int64;
  /** Players on the board. */
  count: number;
}

export interface Entry {
  player: string;
  score: Int64;
  rank: number;
}

export type AuthResult = true | { role: "read" | "write" };

export type SetManyEntry = readonly [player: string, score: Int64] | { player: string; score: Int64 };

/** Connects (over TLS if asked) and, with `token`, authenticates. */
export function connect(host: string, port: number, options?: ConnectOptions): Promise<RankdClient>;

/**
 * One connection. Calls may be made without awaiting earlier ones: they are
 * pipelined and each promise settles with its own reply (in order).
 */
export class RankdClient extends EventEmitter {
  /** Use {@link connect}; wraps a connected socket. */
  constructor(socket: Duplex, options?: { timeoutMs?: number });

  /** Requests sent and not yet answered. */
  readonly inflight: number;

  /**
   * Sends any op; `undefined`/`null` fields are left out. Resolves with the
   * `ok` result, rejects with a {@link RankdError} on `err`.
   */
  call<T = unknown>(op: string, fields?: Record<string, unknown>): Promise<T>;

  ping(): Promise<"pong">;
  auth(token: string): Promise<AuthResult>;
  /** `true` if created, `false` if it already existed with this config (else `conflict`). */
  createBoard(board: string, config?: BoardConfig): Promise<boolean>;
  /** `true` if the board existed. */
  dropBoard(board: string): Promise<boolean>;
  boards(options?: Record<string, unknown>): Promise<BoardInfo[]>;
  /** Resolves with the score stored after the write (first window). */
  set(board: string, player: string, score: Int64, options?: WriteOptions): Promise<Int64>;
  /** At most 10 000 entries; resolves with the stored scores, in entry order. */
  setMany(board: string, entries: Iterable<SetManyEntry>, options?: WriteOptions): Promise<Int64[]>;
  get(board: string, player: string, options?: ReadOptions): Promise<Int64 | null>;
  /** `true` if the player was present. */
  remove(board: string, player: string, options?: Record<string, unknown>): Promise<boolean>;
  count(board: string, options?: ReadOptions): Promise<number>;
  rank(board: string, player: string, options?: ReadOptions): Promise<Rank | null>;
  rankOfScore(board: string, score: Int64, options?: ReadOptions): Promise<number>;
  top(board: string, options?: TopOptions): Promise<Entry[]>;
  around(board: string, player: string, options?: AroundOptions): Promise<Entry[]>;

  /** Closes once the replies in flight are in; new calls reject. */
  close(): Promise<void>;
  /** Closes now; requests in flight reject with a {@link RankdConnectionError}. */
  destroy(): void;

  on(event: "push", listener: (push: { watch: number; event: unknown }) => void): this;
  on(event: "close", listener: () => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: "push", listener: (push: { watch: number; event: unknown }) => void): this;
  once(event: "close", listener: () => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}
