// The shared conformance cases (clients/conformance/cases.json; the format
// is in clients/conformance/README.md), run with this client: every step's
// request through `call(op, fields)` on one connection, in order, its `ok`
// compared by value (integers by value, whether number or bigint) or its
// `err` code checked. The Rust and Python clients' tests run the same file.
//
// The cases need a FRESH rankd of their own, in plaintext and without a
// token: its address (host:port) goes in RANKD_CONFORMANCE_ADDR, and they
// are skipped without it. (Not RANKD_ADDR: `npm test` runs the other test
// files against that server at the same time, and their boards would show
// in the `boards` steps; a second run on one server fails too.)
// tests/node_client.rs starts such a server and runs this file.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import { RankdError, connect } from "../index.js";

const ADDR = process.env.RANKD_CONFORMANCE_ADDR || undefined;
const SKIP = ADDR ? false : "RANKD_CONFORMANCE_ADDR (host:port of a fresh rankd, plaintext, no token) is not set";

/**
 * Parses JSON as JSON.parse does, except that an integer beyond
 * ±(2^53 - 1) becomes a `bigint` (JSON.parse would round it): the same
 * convention as this client's results.
 */
function parseJson(text) {
  let at = 0;
  const token = (pattern) => {
    pattern.lastIndex = at;
    const found = pattern.exec(text);
    if (found) at = pattern.lastIndex;
    return found?.[0];
  };
  const space = () => token(/[ \t\n\r]*/y);
  const fail = (what) => {
    throw new SyntaxError(`cases.json: ${what} at offset ${at}`);
  };
  const expect = (char) => {
    space();
    if (text[at] !== char) fail(`expected ${char}`);
    at++;
  };
  const string = () => {
    const raw = token(/"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y);
    return raw === undefined ? fail("expected a string") : JSON.parse(raw);
  };
  const value = () => {
    space();
    switch (text[at]) {
      case "{": {
        at++;
        const object = {};
        if ((space(), text[at] === "}")) return at++, object;
        for (;;) {
          space();
          const key = string();
          expect(":");
          object[key] = value();
          if ((space(), text[at] !== ",")) break;
          at++;
        }
        expect("}");
        return object;
      }
      case "[": {
        at++;
        const list = [];
        if ((space(), text[at] === "]")) return at++, list;
        for (;;) {
          list.push(value());
          if ((space(), text[at] !== ",")) break;
          at++;
        }
        expect("]");
        return list;
      }
      case '"':
        return string();
      default: {
        const literal = token(/true|false|null/y);
        if (literal !== undefined) return JSON.parse(literal);
        const number = token(/-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y);
        if (number === undefined) fail("expected a value");
        if (/^-?[0-9]+$/.test(number)) {
          const int = BigInt(number);
          return int >= BigInt(Number.MIN_SAFE_INTEGER) && int <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(int) : int;
        }
        return Number(number);
      }
    }
  };
  const parsed = value();
  space();
  if (at !== text.length) fail("trailing characters");
  return parsed;
}

/** Whether `got` equals `want`, integers compared by value (number or bigint), maps whatever their key order. */
function sameValue(got, want) {
  const integer = (v) => typeof v === "bigint" || Number.isInteger(v);
  if (integer(got) && integer(want)) return BigInt(got) === BigInt(want);
  if (Array.isArray(want)) {
    return Array.isArray(got) && got.length === want.length && want.every((item, i) => sameValue(got[i], item));
  }
  if (want !== null && typeof want === "object") {
    if (got === null || typeof got !== "object" || Array.isArray(got)) return false;
    const keys = Object.keys(want);
    return (
      Object.keys(got).length === keys.length &&
      keys.every((key) => Object.hasOwn(got, key) && sameValue(got[key], want[key]))
    );
  }
  return Object.is(got, want);
}

/** A value for a failure message (bigints as `123n`). */
const show = (value) => JSON.stringify(value, (_, v) => (typeof v === "bigint" ? `${v}n` : v));

const cases = parseJson(readFileSync(new URL("../../conformance/cases.json", import.meta.url), "utf8"));
assert.equal(cases.version, 1, "clients/conformance/cases.json format version");

describe("conformance cases (clients/conformance/cases.json)", { skip: SKIP }, () => {
  let client;

  before(async () => {
    const at = ADDR.lastIndexOf(":");
    const host = ADDR.slice(0, at).replace(/^\[(.*)\]$/, "$1");
    // Every step goes out exactly as written: no wid added, nothing sent again.
    client = await connect(host, Number(ADDR.slice(at + 1)), { timeoutMs: 10_000, retryWrites: false, reconnect: false });
  });

  after(() => client?.destroy());

  for (const step of cases.steps) {
    test(step.name, async () => {
      const { op, ...fields } = step.request;
      let got;
      try {
        got = { ok: await client.call(op, fields) };
      } catch (err) {
        if (!(err instanceof RankdError)) throw err; // the connection failed
        got = { err: err.code, msg: err.msg };
      }
      if ("ok" in step) {
        assert.ok("ok" in got, `expected ok ${show(step.ok)}, got err ${got.err}: ${got.msg}`);
        assert.ok(sameValue(got.ok, step.ok), `expected ok ${show(step.ok)}, got ok ${show(got.ok)}`);
      } else {
        assert.equal(got.err, step.err, `expected err ${step.err}, got ${"ok" in got ? `ok ${show(got.ok)}` : `err ${got.err}: ${got.msg}`}`);
      }
    });
  }
});
