// Reaching a server: `connect` opens a socket (TCP, or TLS with the server's
// name checked and an optional client certificate), wraps it in a
// RankdClient and gives the client the same way to dial again.

import { readFileSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";

import { RankdClient, clientOptions } from "./client.js";
import { DEFAULT_TIMEOUT_MS } from "./connection.js";
import { RankdConnectionError } from "./errors.js";

/**
 * Connects to a rankd server; over TLS when `tls`, `caFile` or `certFile`
 * is given, then `auth`s with `token` if given (rejecting if refused). The
 * client reconnects the same way (and with the same token) when it must.
 */
export async function connect(
  host,
  port,
  {
    tls: useTls = false,
    caFile,
    serverName,
    certFile,
    keyFile,
    token,
    timeoutMs = DEFAULT_TIMEOUT_MS,
    retryWrites,
    writeRetries,
    retryDeadlineMs,
    maxFrame,
    reconnect,
    watchRetries,
  } = {},
) {
  const options = { timeoutMs, retryWrites, writeRetries, retryDeadlineMs, maxFrame, reconnect, watchRetries };
  clientOptions(options); // (a wrong option throws before anything is dialed)
  if (certFile != null && keyFile == null) {
    throw new TypeError("certFile needs keyFile (the client certificate's private key)");
  }
  const secure = Boolean(useTls) || caFile != null || certFile != null;
  const dial = () => openSocket(host, port, secure, { caFile, serverName, certFile, keyFile }, timeoutMs);
  const socket = await dial();
  const client = new RankdClient(socket, { ...options, dial });
  if (token != null) {
    try {
      await client.auth(token);
    } catch (err) {
      client.destroy();
      throw err;
    }
  }
  return client;
}

/** A connected socket (TLS handshake done), or a rejection. */
async function openSocket(host, port, secure, tlsFiles, timeoutMs) {
  const socket = secure ? tls.connect(tlsOptions(host, port, tlsFiles)) : net.connect({ host, port });
  await new Promise((resolve, reject) => {
    const ready = secure ? "secureConnect" : "connect";
    let timer;
    const done = (err) => {
      clearTimeout(timer);
      socket.off(ready, onReady);
      socket.off("error", done);
      socket.off("close", onClose);
      if (err) {
        socket.destroy();
        reject(err);
      } else {
        resolve();
      }
    };
    const onReady = () => done();
    const onClose = () => done(new RankdConnectionError(`connection to ${host}:${port} closed while connecting`));
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      const message = `connecting to ${host}:${port} timed out after ${timeoutMs} ms`;
      timer = setTimeout(() => done(new RankdConnectionError(message)), timeoutMs);
    }
    socket.once(ready, onReady);
    socket.once("error", done);
    socket.once("close", onClose);
  });
  return socket;
}

function tlsOptions(host, port, { caFile, serverName, certFile, keyFile }) {
  // The name the certificate must carry; SNI only takes a DNS name.
  const expected = serverName ?? host;
  const options = {
    host,
    port,
    checkServerIdentity: (_hostname, cert) => tls.checkServerIdentity(expected, cert),
  };
  if (!net.isIP(expected)) options.servername = expected;
  if (caFile != null) options.ca = readFileSync(caFile);
  if (certFile != null) {
    options.cert = readFileSync(certFile);
    options.key = readFileSync(keyFile);
  }
  return options;
}
