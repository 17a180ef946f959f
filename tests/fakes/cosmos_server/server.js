#!/usr/bin/env node
"use strict";

/**
 * Starts @vercel/cosmosdb-server (pinned 1.0.1) through its JS API, patched by
 * ./patches.js, with HTTP keep-alive, on 127.0.0.1.
 *
 * Usage: node server.js [PORT]      (or COSMOS_SERVER_PORT=PORT; 0 or none = any free port)
 *
 * Prints one line when it accepts connections:
 *   COSMOS_SERVER_READY port=<port> endpoint=https://127.0.0.1:<port>/
 *
 * Keep-alive matters: the stock CLI answers every request with
 * `connection: close`, so each SDK call pays a new TCP + TLS handshake
 * (~40 requests/s); with keep-alive the SDK reuses its connections.
 *
 * With COSMOS_SERVER_EXIT_ON_STDIN_EOF=1 the server exits when its stdin closes,
 * so it never outlives a test runner that dies without cleaning up.
 */

const patches = require("./patches");

patches.apply(); // before the first request: it replaces request routing and store hooks

const { createHttpsServer } = require("@vercel/cosmosdb-server");

const HOST = "127.0.0.1";
const rawPort = process.argv[2] || process.env.COSMOS_SERVER_PORT || "0";
const port = Number.parseInt(rawPort, 10);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`invalid port: ${rawPort}`);
  process.exit(2);
}

// keepAlive: true makes lib/index.js answer `connection: keep-alive` instead of `close`.
const server = createHttpsServer({ keepAlive: true });
// Keep idle connections longer than the SDK's pauses between calls (Node's default is 5 s).
server.keepAliveTimeout = 120 * 1000;
server.headersTimeout = 125 * 1000;

server.on("error", (err) => {
  console.error(`cosmos test server failed: ${err.stack || err}`);
  process.exit(1);
});

server.listen(port, HOST, () => {
  const actual = server.address().port;
  console.log(`COSMOS_SERVER_READY port=${actual} endpoint=https://${HOST}:${actual}/`);
});

function shutdown() {
  server.close();
  // Open keep-alive sockets would hold close() up: do not wait for them.
  setTimeout(() => process.exit(0), 200).unref();
}

process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

if (process.env.COSMOS_SERVER_EXIT_ON_STDIN_EOF === "1") {
  process.stdin.on("end", shutdown);
  process.stdin.on("error", shutdown);
  process.stdin.resume();
}
