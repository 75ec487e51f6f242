// Type definitions for rankd-client (hand-written; the code is index.js and lib/).

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
/** Default `writeRetries`: 3. */
export const DEFAULT_WRITE_RETRIES: number;
/** Default `watchRetries`: 10. */
export const DEFAULT_WATCH_RETRIES: number;

/**
 * The longest wait, in milliseconds, before the `attempt`-th re-send of a
 * write or reconnection of a watch (1-based): 100, 200, 400, ... at most
 * 2000; 0 for 0. The client waits a random time between half of it and all
 * of it, so clients that lost the same server do not come back in step.
 */
export function retryDelay(attempt: number): number;

export type ErrorCode =
  | "bad_frame"
  | "bad_request"
  | "unknown_op"
  | "too_large"
  | "conflict"
  | "unauthorized"
  | "overloaded"
  | "internal";

/**
 * An error answered by the server (`{"err": {"code", "msg"}}`), or
 * `too_large` from the client for a request over `maxFrame` (not sent).
 */
export class RankdError extends Error {
  constructor(code: string, msg: string, options?: { cause?: unknown; maybeApplied?: boolean; wid?: string; sends?: number });
  readonly name: "RankdError";
  /** The protocol's error code. */
  readonly code: ErrorCode | (string & {});
  /** The server's explanation, for people. */
  readonly msg: string;
  /**
   * The request was a write an earlier send of which may have applied (its
   * reply was lost), e.g. one refused `unauthorized` on a new connection.
   */
  readonly maybeApplied: boolean;
  /** For a write with a `wid` the client sends again: its `wid` (e.g. `overloaded` after the re-sends ran out: it did not apply, send it again later with this `wid`). */
  readonly wid?: string;
  /** For a write with a `wid`: how many times it was sent. */
  readonly sends?: number;
}

/**
 * The connection failed, timed out, was closed, or the server broke the
 * protocol; every request in flight that is not sent again rejects with it.
 * Also a write with a `wid` whose re-sends ran out after `internal` answers
 * (`maybeApplied`; the server's {@link RankdError} is its `cause`). The
 * underlying error, if any, is its `cause`.
 */
export class RankdConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown; maybeApplied?: boolean; wid?: string; sends?: number });
  readonly name: "RankdConnectionError";
  /** The request was a write that may or may not have applied. */
  readonly maybeApplied: boolean;
  /** The write's `wid`, if it carried one: sending it again with this `wid` is safe (within the server's horizon). */
  readonly wid?: string;
  /** How many times the write was sent. */
  readonly sends?: number;
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
  /**
   * Bound on connecting, and on waiting for each reply from the later of its
   * request's send and the previous reply on the connection, ms (default
   * 30 000; 0: none). A late reply fails the connection.
   */
  timeoutMs?: number;
  /**
   * Give every `set`, `setMany` and `remove` a `wid` (32 random hex digits)
   * unless it has one, and send a write carrying a `wid` again, with the
   * same `wid`: on a new connection after a timeout or a lost connection, on
   * the same one after `overloaded` or `internal` (default true). Turn off
   * for a version-1 server, which ignores `wid`.
   */
  retryWrites?: boolean;
  /**
   * How many times at most such a write is sent again (default 3), each
   * after a random wait between half and all of 100 ms, 200 ms, 400 ms, ...
   * (at most 2 s).
   */
  writeRetries?: number;
  /**
   * No re-send of a write starts later than this after its first send, ms
   * (default 60 000). Above 300 000 (5 minutes), or not a positive finite
   * number: a `RangeError`. The server remembers a `wid` for its dedup
   * horizon (10 minutes by default); a re-send after that may apply twice.
   */
  retryDeadlineMs?: number;
  /**
   * The largest request frame body sent, bytes (default 1 048 576, the
   * server's default `max_frame`); a larger request rejects with a
   * {@link RankdError} `too_large` and is not sent. A request that may be
   * sent again (a write with a `wid`, a read) is checked once, before its
   * first send, with room for the longest request id a re-send may carry
   * (up to 8 bytes more).
   */
  maxFrame?: number;
  /**
   * Replace a broken connection: for writes sent again, for reads sent once
   * more, for the next call and for the open watches (default true). Off: a
   * broken connection ends the client.
   */
  reconnect?: boolean;
  /** How many reconnections in a row a watch tries before it ends with the error (default 10). */
  watchRetries?: number;
}

/** Options of the {@link RankdClient} constructor (what `connect` passes). */
export interface ClientOptions {
  timeoutMs?: number;
  retryWrites?: boolean;
  writeRetries?: number;
  retryDeadlineMs?: number;
  maxFrame?: number;
  reconnect?: boolean;
  watchRetries?: number;
  /** Opens a new connected socket, to reconnect; without it a broken connection ends the client. */
  dial?: () => Promise<Duplex>;
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
  /** 1 to 64 bytes, never reused for another write on the board: the server applies the write at most once. */
  wid?: string;
  /** Resolve with a {@link WriteResult} instead of the bare result. */
  info?: boolean;
  [field: string]: unknown;
}

export interface RemoveOptions {
  /** As for `set`. */
  wid?: string;
  /** Resolve with a {@link WriteResult} instead of the bare result. */
  info?: boolean;
  [field: string]: unknown;
}

/** What a write resolves with given `info: true`. */
export interface WriteResult<T> {
  /** What the write resolves with otherwise (for a duplicate, the first application's result). */
  result: T;
  /** The server had already applied this (board, wid) and changed nothing (`"dup": true`). */
  dup: boolean;
  /** The `wid` sent (`undefined` for a write without one). */
  wid: string | undefined;
  /** How many times the request was sent: `dup` after more than 1 means an earlier send had applied. */
  sends: number;
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

/** An event of a `top` watch: the list `top` would answer; `null` once, last, when the board is dropped. */
export type TopEvent = Entry[] | null;
/** An event of a `player` watch: what `rank` would answer; `null` while the player is absent. */
export type PlayerEvent = Rank | null;

export interface WatchOptions {
  window?: Window;
  period?: number;
  /** At most one push per interval, 10 to 60 000 ms (default 100). */
  intervalMs?: number;
  /** How many unread events the watch keeps for iteration, the newest (default 1). */
  buffer?: number;
  [field: string]: unknown;
}

/** What a `top` watch follows: the best N (1 to 100). */
export interface TopTarget extends WatchOptions {
  top: number;
  player?: undefined;
}

/** What a `player` watch follows. */
export interface PlayerTarget extends WatchOptions {
  player: string;
  top?: undefined;
}

/** Connects (over TLS if asked) and, with `token`, authenticates. */
export function connect(host: string, port: number, options?: ConnectOptions): Promise<RankdClient>;

/**
 * One connection. Calls may be made without awaiting earlier ones: they are
 * pipelined and each promise settles with its own reply (in order).
 */
export class RankdClient extends EventEmitter {
  /** Use {@link connect}; wraps a connected socket. */
  constructor(socket: Duplex, options?: ClientOptions);

  /** Requests sent and not yet answered, or waiting for a new connection. */
  readonly inflight: number;
  /** Whether writes get a `wid` and are sent again after a lost reply. */
  readonly retryWrites: boolean;
  /** How many times a broken connection was replaced by a new one. */
  readonly reconnects: number;
  /** The open watches. */
  readonly watches: Watch<unknown>[];

  /**
   * Sends any op; `undefined`/`null` fields are left out. Resolves with the
   * `ok` result, rejects with a {@link RankdError} on `err`. A `set`,
   * `set_many` or `remove` gets a `wid` with `retryWrites`.
   */
  call<T = unknown>(op: string, fields: Record<string, unknown>, options: { info: true }): Promise<WriteResult<T>>;
  call<T = unknown>(op: string, fields?: Record<string, unknown>, options?: { info?: false }): Promise<T>;

  ping(): Promise<"pong">;
  auth(token: string): Promise<AuthResult>;
  /** `true` if created, `false` if it already existed with this config (else `conflict`). */
  createBoard(board: string, config?: BoardConfig): Promise<boolean>;
  /** `true` if the board existed. */
  dropBoard(board: string): Promise<boolean>;
  boards(options?: Record<string, unknown>): Promise<BoardInfo[]>;
  /** Resolves with the score stored after the write (first window); with `info: true`, a {@link WriteResult}. */
  set(board: string, player: string, score: Int64, options: WriteOptions & { info: true }): Promise<WriteResult<Int64>>;
  set(board: string, player: string, score: Int64, options?: WriteOptions & { info?: false }): Promise<Int64>;
  /** At most 10 000 entries; resolves with the stored scores, in entry order. */
  setMany(board: string, entries: Iterable<SetManyEntry>, options: WriteOptions & { info: true }): Promise<WriteResult<Int64[]>>;
  setMany(board: string, entries: Iterable<SetManyEntry>, options?: WriteOptions & { info?: false }): Promise<Int64[]>;
  get(board: string, player: string, options?: ReadOptions): Promise<Int64 | null>;
  /** `true` if the player was present. */
  remove(board: string, player: string, options: RemoveOptions & { info: true }): Promise<WriteResult<boolean>>;
  remove(board: string, player: string, options?: RemoveOptions & { info?: false }): Promise<boolean>;
  count(board: string, options?: ReadOptions): Promise<number>;
  rank(board: string, player: string, options?: ReadOptions): Promise<Rank | null>;
  rankOfScore(board: string, score: Int64, options?: ReadOptions): Promise<number>;
  top(board: string, options?: TopOptions): Promise<Entry[]>;
  around(board: string, player: string, options?: AroundOptions): Promise<Entry[]>;
  /** Those of `players` (1 to 1000 names) present, each once, best first, each with its board-wide rank. */
  ranks(board: string, players: Iterable<string>, options?: ReadOptions): Promise<Entry[]>;

  /**
   * Follows a board's best `top` entries or one `player`'s rank; resolves
   * once the server has accepted the watch (a 65th on one connection:
   * `too_large`). The options may also go in `target`.
   */
  watch(board: string, target: TopTarget, options?: WatchOptions): Promise<Watch<TopEvent>>;
  watch(board: string, target: PlayerTarget, options?: WatchOptions): Promise<Watch<PlayerEvent>>;
  /**
   * Ends a watch, or the watch with this id on the current connection:
   * `true` if the server had it open.
   */
  unwatch(watch: Watch<unknown> | number | bigint): Promise<boolean>;

  /** Closes once the replies in flight are in (writes sent again included); new calls reject, watches end. */
  close(): Promise<void>;
  /** Closes now; requests in flight reject with a {@link RankdConnectionError}, watches end. */
  destroy(): void;

  on(event: "push", listener: (push: { watch: number; event: unknown }) => void): this;
  on(event: "disconnect", listener: (error: RankdConnectionError) => void): this;
  on(event: "reconnect", listener: () => void): this;
  on(event: "close", listener: () => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: "push", listener: (push: { watch: number; event: unknown }) => void): this;
  once(event: "disconnect", listener: (error: RankdConnectionError) => void): this;
  once(event: "reconnect", listener: () => void): this;
  once(event: "close", listener: () => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}

/**
 * A watch: an async iterable of its events (`for await`), which ends when
 * the watch ends (leaving the loop early leaves it open), and an
 * EventEmitter of `event` (each event) and `end` (reason, error).
 */
export class Watch<T = TopEvent | PlayerEvent> extends EventEmitter implements AsyncIterable<T> {
  private constructor();
  /** The board watched. */
  readonly board: string;
  /** The N of a `top` watch. */
  readonly top: number | undefined;
  /** The player of a `player` watch. */
  readonly player: string | undefined;
  /** The server's id of the watch on its current connection; `null` while it has none. */
  readonly id: number | null;
  /** How many times it asked again on a new connection. */
  readonly resubscribes: number;
  /** The newest event received (`undefined` before the first). */
  readonly latest: T | undefined;
  /** Whether it may still deliver events. */
  readonly active: boolean;
  /** Why it ended (`"unwatched"`, `"the board was dropped"`, `"the client is closed"`, ...), or `undefined`. */
  readonly ended: string | undefined;
  /** The error that ended it, if one did (its iteration throws it). */
  readonly error: Error | undefined;
  /** Unread events. */
  readonly pending: number;

  /** Ends the watch: `true` if the server had it open. */
  close(): Promise<boolean>;
  [Symbol.asyncIterator](): AsyncGenerator<T, void, undefined>;
  /** The events until the watch ends, or until none comes for `idleMs` (the watch stays open). */
  events(options?: { idleMs?: number }): AsyncGenerator<T, void, undefined>;

  on(event: "event", listener: (event: T) => void): this;
  on(event: "end", listener: (reason: string, error: Error | undefined) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: "event", listener: (event: T) => void): this;
  once(event: "end", listener: (reason: string, error: Error | undefined) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
}
