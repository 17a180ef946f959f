"use strict";

/**
 * Patches that make @vercel/cosmosdb-server 1.0.1 behave like real Cosmos DB
 * where it differs, for wire tests with the real azure-cosmos Python SDK.
 *
 * They hook the package's internals (lib/routes.js, lib/account/*, lib/handler/*),
 * so they are tied to exactly version 1.0.1 (pinned in package-lock.json);
 * `apply()` refuses any other version.
 *
 * Hooks used:
 *   - lib/routes.js exports `default(req) -> [params, handler] | undefined`, and
 *     lib/index.js looks it up on every request, so replacing `routes.default`
 *     lets us route requests to our own handlers (and wrap the stock ones).
 *   - every document write goes through `Items.prototype._set` and every removal
 *     through `Items.prototype.delete` (lib/account/items.js); overriding them on
 *     `Documents.prototype` gives one place to keep the change-feed log.
 *
 * A handler returns the response body; lib/index.js then JSON-encodes it, sets
 * `etag` from `body._etag`, and (when an `a-im` request header is present and the
 * status is 200) rewrites the status to 304 and the etag to "1" - a stub meant
 * for the pkranges feed, which our change-feed handler turns off by deleting the
 * `a-im` header of its own requests.
 *
 * Behaviours added or fixed (each covered by tests/fakes/test_cosmos_server.py):
 *   1. point read of a missing item -> 404 NotFound (stock: 500 TypeError, which
 *      the SDK retries); all 404s get a Cosmos-style {code: "NotFound"} body.
 *   2. a query sent with x-ms-documentdb-partitionkey is scoped to that value
 *      (stock: ignored; without enable-cross-partition it even answered 400).
 *   3. an incremental (latest-version) change feed per container, keyed by a
 *      per-container LSN; etag / If-None-Match carry the LSN as in Cosmos.
 *   4. conditional point read: If-None-Match equal to the item's etag -> 304.
 *   5. transactional batch with all six operation types and rollback.
 *   6. (If-Match -> 412 on a stale etag already works in the stock handlers.)
 *   7. GET /_test/stats and POST /_test/reset: request counters.
 *   8. hierarchical partition keys (kind MultiHash, version 2, 2 or 3 paths): a
 *      container is created with one; every point operation needs the full key
 *      (an array of one value per path, 400 otherwise, and 400 when it is not the
 *      document's); an item is identified by (full key, id); a query with a
 *      prefix of the key (which the SDK sends as an effective-partition-key
 *      range) or with the full key is scoped to it, and so is a change feed.
 *   +  ORDER BY on several paths is also served by a composite index in the fully
 *      opposite direction (DESC, DESC from an ASC, ASC index), as in Cosmos.
 */

const fs = require("fs");
const path = require("path");

const PINNED_VERSION = "1.0.1";
const PKG_DIR = path.dirname(require.resolve("@vercel/cosmosdb-server/package.json"));
const LIB = path.join(PKG_DIR, "lib");
const lib = (name) => require(path.join(LIB, name));

const routesModule = lib("routes");
const Items = lib("account/items").default;
const Documents = lib("account/documents").default;
const documentOperations = lib("handler/_document-operations");
const { patchOperation } = lib("handler/_patch-operations");
const readItems = lib("handler/_read-items").default;
const jsonModule = lib("json");
const readBodyOnce = jsonModule.default;
/** lib/json.js reads the request stream, which can be read once: keep what it read on the request. */
async function readJson(req) {
  if (!Object.prototype.hasOwnProperty.call(req, "_cosmosTestBody")) req._cosmosTestBody = await readBodyOnce(req);
  return req._cosmosTestBody;
}
const trueHeader = lib("true-header").default;
const pathMatch = lib("path-match").default;
const { parsePartitionKey } = lib("utils/get-partition-from-header");
const getValue = lib("utils/get-value").default;
const cosmosQuery = require(require.resolve("@zeit/cosmosdb-query", { paths: [PKG_DIR] }));

const NOT_FOUND = Object.freeze({
  code: "NotFound",
  message: "Entity with the specified id does not exist in the system."
});
const MAX_BATCH_OPERATIONS = 100;
const MAX_KEY_LEVELS = 3;
const KEY_MISMATCH =
  "Partition key provided either doesn't correspond to definition in the collection or doesn't match " +
  "partition key field values specified in the document.";
const DEFAULT_FEED_PAGE_SIZE = 100;

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/** The request path as the stock router sees it: no leading "//", no trailing "/". */
function normalisedPath(req) {
  let pathname = new URL(req.url, "https://localhost").pathname;
  if (pathname.startsWith("//")) pathname = pathname.slice(1);
  while (pathname.length > 1 && pathname.endsWith("/")) pathname = pathname.slice(0, -1);
  return pathname;
}

/**
 * The partition key value sent in x-ms-documentdb-partitionkey.
 * Returns {present: false} when absent; `{}` in the header (the SDK's "undefined"
 * partition key) is reported as value `undefined`.
 */
function partitionKeyHeader(req) {
  const raw = req.headers["x-ms-documentdb-partitionkey"];
  if (!raw) return { present: false };
  let parsed;
  try {
    parsed = JSON.parse(Array.isArray(raw) ? raw[0] : raw);
  } catch (err) {
    return { present: false };
  }
  const values = (Array.isArray(parsed) ? parsed : [parsed]).map(
    (v) => (v !== null && typeof v === "object" ? undefined : v)
  );
  return { present: true, value: values[0], values };
}

/**
 * The (first) partition key path of a collection as a list of keys, e.g. ["pk"].
 * Like the stock store, these patches handle single-path partition keys only.
 */
function partitionKeyPath(collectionData) {
  const paths = ((collectionData || {}).partitionKey || {}).paths || [];
  if (!paths.length || paths[0] === "/_partitionKey") return ["id"];
  return paths[0].slice(1).split("/");
}

/** A collection's partition key definition ({paths, kind, version}). */
function partitionDefinition(collectionData) {
  return (collectionData || {}).partitionKey || {};
}

const isHierarchical = (definition) => definition.kind === "MultiHash";

/** A document's value at each partition key path. */
function partitionValues(definition, doc) {
  return (definition.paths || []).map((p) => getValue(p.slice(1).split("/"), doc));
}

/**
 * The partition a hierarchical key's item is stored under: the stock store keys
 * items by one partition string, so the full key is encoded as one (JSON of its
 * components; an absent component is null).
 */
function hierarchicalToken(values) {
  return JSON.stringify(values.map((v) => (v === undefined ? null : v)));
}

/** The partition value the stock store indexes a request's item under. */
function storePartition(req, id) {
  const raw = req.headers["x-ms-documentdb-partitionkey"];
  return raw ? parsePartitionKey(Array.isArray(raw) ? raw[0] : raw, id) : id;
}

/** A Cosmos-style error body. */
function errorBody(code, message) {
  return { code, message };
}

// ---------------------------------------------------------------------------
// Effective partition key (hash v2), needed because the SDK scopes a change
// feed with `partition_key=` by sending an EPK range (x-ms-start-epk /
// x-ms-end-epk), not the partition key value. Port of the SDK's
// PartitionKey._get_effective_partition_key_for_hash_partitioning_v2.
// ---------------------------------------------------------------------------

const M64 = (1n << 64n) - 1n;
const rotl64 = (x, r) => ((x << BigInt(r)) | (x >> BigInt(64 - r))) & M64;
const fmix64 = (k) => {
  k ^= k >> 33n;
  k = (k * 0xff51afd7ed558ccdn) & M64;
  k ^= k >> 33n;
  k = (k * 0xc4ceb9fe1a85ec53n) & M64;
  k ^= k >> 33n;
  return k;
};

/** MurmurHash3 x64 128-bit, seed 0; returns [h1 (low), h2 (high)]. */
function murmur3x64128(buf) {
  const c1 = 0x87c37b91114253d5n;
  const c2 = 0x4cf5ad432745937fn;
  let h1 = 0n;
  let h2 = 0n;
  const blocks = Math.floor(buf.length / 16);
  for (let i = 0; i < blocks; i += 1) {
    let k1 = buf.readBigUInt64LE(i * 16);
    let k2 = buf.readBigUInt64LE(i * 16 + 8);
    k1 = (rotl64((k1 * c1) & M64, 31) * c2) & M64;
    h1 ^= k1;
    h1 = (((rotl64(h1, 27) + h2) & M64) * 5n + 0x52dce729n) & M64;
    k2 = (rotl64((k2 * c2) & M64, 33) * c1) & M64;
    h2 ^= k2;
    h2 = (((rotl64(h2, 31) + h1) & M64) * 5n + 0x38495ab5n) & M64;
  }
  const tail = blocks * 16;
  const rest = buf.length & 15;
  let k1 = 0n;
  let k2 = 0n;
  for (let i = rest - 1; i >= 8; i -= 1) k2 ^= BigInt(buf[tail + i]) << BigInt((i - 8) * 8);
  for (let i = Math.min(rest, 8) - 1; i >= 0; i -= 1) k1 ^= BigInt(buf[tail + i]) << BigInt(i * 8);
  h2 ^= (rotl64((k2 * c2) & M64, 33) * c1) & M64;
  h1 ^= (rotl64((k1 * c1) & M64, 31) * c2) & M64;
  const len = BigInt(buf.length);
  h1 ^= len;
  h2 ^= len;
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  h1 = fmix64(h1);
  h2 = fmix64(h2);
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  return [h1, h2];
}

/** Binary encoding of one partition key component for hashing (v2). */
function encodeComponent(value) {
  if (value === undefined) return Buffer.from([0x00]);
  if (value === null) return Buffer.from([0x01]);
  if (value === false) return Buffer.from([0x02]);
  if (value === true) return Buffer.from([0x03]);
  if (typeof value === "number") {
    const b = Buffer.alloc(9);
    b[0] = 0x05;
    b.writeDoubleLE(value, 1);
    return b;
  }
  if (typeof value === "string") {
    return Buffer.concat([Buffer.from([0x08]), Buffer.from(value, "utf8"), Buffer.from([0xff])]);
  }
  return Buffer.from([0x00]); // objects/arrays are not valid partition keys: treat as undefined
}

/** Effective partition key (32 upper-case hex chars) of a single-path hash v2 key. */
function effectivePartitionKeyV2(value) {
  const [low, high] = murmur3x64128(encodeComponent(value));
  const bytes = Buffer.alloc(16);
  bytes.writeBigUInt64LE(low, 0);
  bytes.writeBigUInt64LE(high, 8);
  bytes.reverse();
  bytes[0] &= 0x3f;
  return bytes.toString("hex").toUpperCase();
}

// ---------------------------------------------------------------------------
// 7. Request counters
// ---------------------------------------------------------------------------

const stats = { total: 0, by_method_resource: {}, by_operation: {} };

function resetStats() {
  stats.total = 0;
  stats.by_method_resource = {};
  stats.by_operation = {};
}

/** "docs", "colls", "dbs" or "other" (account, pkranges, udfs, ...). */
function resourceType(pathname) {
  const segments = pathname.split("/").filter(Boolean);
  // Resource types sit at even positions: dbs/{id}/colls/{id}/docs/{id}
  const types = segments.filter((_, i) => i % 2 === 0);
  const last = types[types.length - 1];
  return ["docs", "colls", "dbs"].includes(last) ? last : "other";
}

/** A finer operation name: read, readfeed, changefeed, query, create, upsert, batch, replace, patch, delete. */
function operationName(req, pathname) {
  const segments = pathname.split("/").filter(Boolean);
  const isFeed = segments.length % 2 === 1; // e.g. dbs/x/colls (the account "/" is a read)
  switch (req.method) {
    case "GET":
      if (req.headers["a-im"]) return "changefeed";
      return isFeed ? "readfeed" : "read";
    case "POST":
      if (trueHeader(req, "x-ms-documentdb-isquery") || req.headers["content-type"] === "application/query+json") {
        return "query";
      }
      if (trueHeader(req, "x-ms-documentdb-is-upsert")) return "upsert";
      if (trueHeader(req, "x-ms-cosmos-is-batch-request")) return "batch";
      return "create";
    case "PUT":
      return "replace";
    default:
      return req.method.toLowerCase();
  }
}

function countRequest(req, pathname) {
  const resource = resourceType(pathname);
  const byMethod = `${req.method} ${resource}`;
  const byOperation = `${operationName(req, pathname)} ${resource}`;
  stats.total += 1;
  stats.by_method_resource[byMethod] = (stats.by_method_resource[byMethod] || 0) + 1;
  stats.by_operation[byOperation] = (stats.by_operation[byOperation] || 0) + 1;
}

/** Routes under /_test/ (never counted, never seen by the SDK). */
function testRoute(req, pathname) {
  if (req.method === "GET" && pathname === "/_test/stats") {
    return [{}, async () => JSON.parse(JSON.stringify(stats))];
  }
  if (req.method === "POST" && pathname === "/_test/reset") {
    return [{}, async () => {
      resetStats();
      return { reset: true };
    }];
  }
  return [{}, async (account, rq, res) => {
    res.statusCode = 404;
    return errorBody("NotFound", `no test route ${req.method} ${pathname}`);
  }];
}

// ---------------------------------------------------------------------------
// 3. Change-feed log: a per-container LSN, latest version per item
// ---------------------------------------------------------------------------

/**
 * The change log of a Documents store: `lsn` is the container's last LSN and
 * `byRid` maps each live item's _rid to the LSN of its latest write. An item is
 * removed and re-inserted on each write, so the Map iterates in LSN order.
 */
function changeLog(documents) {
  if (!documents._changeLog) documents._changeLog = { lsn: 0, byRid: new Map() };
  return documents._changeLog;
}

function installChangeLog() {
  // create, upsert, replace and patch all end in _set (replace = delete + _set).
  Documents.prototype._set = function setWithLsn(data) {
    const result = Items.prototype._set.call(this, data);
    const log = changeLog(this);
    log.lsn += 1;
    log.byRid.delete(data._rid);
    log.byRid.set(data._rid, log.lsn);
    return result;
  };
  Documents.prototype.delete = function deleteFromLog(idOrRid, partition) {
    const data = this._item("/id", idOrRid, partition).read();
    Items.prototype.delete.call(this, idOrRid, partition);
    if (data) changeLog(this).byRid.delete(data._rid);
  };
}

/** Parse an LSN etag ("12", "\"12\"") - returns null when it is not one. */
function parseLsn(etag) {
  if (!etag) return null;
  const text = String(etag).replace(/^W\//, "").replace(/^["']|["']$/g, "");
  return /^\d+$/.test(text) ? parseInt(text, 10) : null;
}

const quoteLsn = (lsn) => `"${lsn}"`;

/** Whether a document's key starts with the given components (all of them for a Hash key). */
function keyMatches(collectionData, doc, values) {
  const definition = partitionDefinition(collectionData);
  if (!isHierarchical(definition)) return getValue(partitionKeyPath(collectionData), doc) === values[0];
  const own = partitionValues(definition, doc);
  return values.every((v, i) => own[i] === v);
}

/**
 * Effective partition key of a document: hash v2 of its one value, or for a
 * hierarchical key the concatenated hash v2 of each component (as the SDK's
 * _get_effective_partition_key_for_multi_hash_partitioning_v2); null when the
 * definition is neither.
 */
function effectivePartitionKey(definition, doc) {
  // A document's key never changes and a write stores a new object, so each
  // object's hash is computed once: scoped scans stay cheap on big containers.
  const cached = epkCache.get(doc);
  if (cached && cached.definition === definition) return cached.epk;
  const epk = computeEffectivePartitionKey(definition, doc);
  epkCache.set(doc, { definition, epk });
  return epk;
}

const epkCache = new WeakMap();

function computeEffectivePartitionKey(definition, doc) {
  const values = partitionValues(definition, doc);
  if (isHierarchical(definition)) return values.map(effectivePartitionKeyV2).join("");
  if ((definition.kind || "Hash") !== "Hash" || definition.version !== 2 || values.length !== 1) return null;
  return effectivePartitionKeyV2(values[0]);
}

/**
 * Which items a request (a query or a change feed) is scoped to: the partition
 * key header (a full key, or a prefix of a hierarchical one), an effective-
 * partition-key range (what the SDK sends for a change feed's `partition_key=`
 * and for a query on a prefix of a hierarchical key), or everything.
 */
function requestScope(req, collectionData) {
  const definition = partitionDefinition(collectionData);
  const pk = partitionKeyHeader(req);
  if (pk.present) {
    const paths = (definition.paths || []).length || 1;
    if (pk.values.length > paths) return { ok: false, message: "test server: more key components than paths" };
    return { ok: true, scoped: true, test: (doc) => keyMatches(collectionData, doc, pk.values) };
  }
  if (req.headers["x-ms-read-key-type"] !== "EffectivePartitionKeyRange") return { ok: true, test: () => true };
  const start = (req.headers["x-ms-start-epk"] || "").toUpperCase();
  const end = (req.headers["x-ms-end-epk"] || "FF").toUpperCase();
  if (start === "" && end === "FF") return { ok: true, scoped: true, test: () => true };
  if (effectivePartitionKey(definition, {}) === null) {
    return { ok: false, message: "test server: an EPK range needs a Hash v2 or MultiHash partition key" };
  }
  return {
    ok: true,
    scoped: true,
    test: (doc) => {
      const epk = effectivePartitionKey(definition, doc);
      return epk >= start && epk < end;
    }
  };
}

/**
 * GET .../docs with `A-IM: Incremental Feed`: the latest version of every item
 * written after the LSN in If-None-Match (from the beginning without it; from
 * now with "*"), in LSN order, at most x-ms-max-item-count per page.
 * 200 with etag = LSN to resume after, or 304 Not Modified with the same.
 */
async function readChangeFeed(account, req, res, { dbId, collId }) {
  const collection = account.database(dbId).collection(collId);
  const collectionData = collection.read();
  if (!collectionData) {
    res.statusCode = 404;
    return { ...NOT_FOUND };
  }
  const mode = req.headers["a-im"];
  // Turn off lib/index.js's a-im stub (it would force 304 / etag "1").
  delete req.headers["a-im"];
  if (String(mode).toLowerCase() !== "incremental feed") {
    res.statusCode = 400;
    return errorBody("BadRequest", `test server: change feed mode '${mode}' is not supported (latest version only)`);
  }
  const log = changeLog(collection.documents);
  const ifNoneMatch = req.headers["if-none-match"];
  let since = 0;
  if (ifNoneMatch === "*") {
    since = log.lsn;
  } else if (ifNoneMatch) {
    since = parseLsn(ifNoneMatch);
    if (since === null) {
      res.statusCode = 400;
      return errorBody("BadRequest", `invalid change feed continuation '${ifNoneMatch}'`);
    }
  }
  const modifiedSince = req.headers["if-modified-since"];
  const notBefore = modifiedSince ? Math.floor(Date.parse(modifiedSince) / 1000) : null;
  const requested = parseInt(req.headers["x-ms-max-item-count"] || "", 10);
  const pageSize = Number.isNaN(requested) ? DEFAULT_FEED_PAGE_SIZE : requested < 0 ? Infinity : requested;
  const scope = requestScope(req, collectionData);
  if (!scope.ok) {
    res.statusCode = 400;
    return errorBody("BadRequest", scope.message);
  }

  const page = [];
  let pageFull = false;
  for (const [rid, lsn] of log.byRid) {
    if (lsn <= since) continue;
    const doc = collection.documents._data.get(rid).read();
    if (notBefore !== null && doc._ts < notBefore) continue;
    if (!scope.test(doc)) continue;
    if (page.length >= pageSize) {
      pageFull = true;
      break;
    }
    page.push({ ...doc, _lsn: lsn });
  }
  // Resume after the last item returned; when the scan reached the end, after
  // everything the container has (so filtered-out changes are not rescanned).
  const resumeLsn = pageFull ? page[page.length - 1]._lsn : Math.max(since, log.lsn);
  res.setHeader("etag", quoteLsn(resumeLsn));
  res.setHeader("x-ms-item-count", String(page.length));
  if (!page.length) {
    res.statusCode = 304; // Not Modified: no body
    return undefined;
  }
  res.statusCode = 200;
  return { _rid: collectionData._rid, Documents: page, _count: page.length };
}

// ---------------------------------------------------------------------------
// 1 + 4. Point read: 404 when missing, 304 on a matching If-None-Match
// ---------------------------------------------------------------------------

async function readDocument(account, req, res, { dbId, collId, docId }) {
  const collection = account.database(dbId).collection(collId);
  if (!collection.read()) {
    res.statusCode = 404;
    return { ...NOT_FOUND };
  }
  const data = collection.document(docId, storePartition(req, docId)).read();
  if (!data) {
    res.statusCode = 404;
    return { ...NOT_FOUND };
  }
  const ifNoneMatch = req.headers["if-none-match"];
  if (ifNoneMatch && (ifNoneMatch === "*" || ifNoneMatch === data._etag)) {
    res.statusCode = 304; // Not Modified: no body, current etag in the header
    res.setHeader("etag", data._etag);
    return undefined;
  }
  res.statusCode = 200;
  return data;
}

// ---------------------------------------------------------------------------
// 2. Queries scoped to the partition key header
// ---------------------------------------------------------------------------

/**
 * The composite indexes an ORDER BY on several paths can use. Cosmos serves such
 * a query from an index with the same paths in the same order and either the
 * same direction on every path or the opposite on every path; the stock query
 * engine only accepts the same directions, so add each index's full reversal.
 */
function servableCompositeIndexes(collectionData) {
  const declared = (collectionData.indexingPolicy || {}).compositeIndexes || [];
  const flip = (order) => (order === "descending" ? "ascending" : "descending");
  const reversed = declared.map((index) => index.map((entry) => ({ ...entry, order: flip(entry.order) })));
  return declared.concat(reversed);
}

async function queryDocuments(account, req, res, { dbId, collId }) {
  return readItems(req, res, "Documents", async ({ continuation, maxItemCount }) => {
    const body = await readJson(req);
    if (!body.query) {
      res.statusCode = 400;
      return errorBody("BadRequest", "missing query");
    }
    const collection = account.database(dbId).collection(collId);
    const collectionData = collection.read();
    if (!collectionData) return null; // readItems answers 404
    const scope = requestScope(req, collectionData);
    if (!scope.ok) {
      res.statusCode = 400;
      return errorBody("BadRequest", scope.message);
    }
    if (!scope.scoped && !trueHeader(req, "x-ms-documentdb-query-enablecrosspartition")) {
      // Stock behaviour: a cross-partition query needs the header unless it filters on the partition key.
      const paths = ((collectionData.partitionKey || {}).paths) || [];
      if (paths.length && !cosmosQuery.default(body.query).containsPartitionKeys(paths)) {
        res.statusCode = 400;
        return errorBody("BadRequest", "Cross partition query is required but disabled.");
      }
    }
    const documents = collection.documents;
    const data = [...documents._data.values()].map((item) => item.read()).filter(scope.test);
    const compositeIndexes = servableCompositeIndexes(collectionData);
    try {
      return documents._getQuery(body.query).exec(data, {
        parameters: body.parameters,
        udf: documents._userDefinedFunctions(),
        maxItemCount,
        continuation,
        compositeIndexes
      });
    } catch (err) {
      if (err instanceof cosmosQuery.SyntaxError) throw err; // readItems answers 400
      res.statusCode = 400;
      return errorBody("BadRequest", err.message);
    }
  });
}

// ---------------------------------------------------------------------------
// 5. Transactional batch with rollback
// ---------------------------------------------------------------------------

/** Everything a batch can change in one container, to restore on failure. */
function snapshot(documents) {
  const log = changeLog(documents);
  return {
    data: new Map(documents._data),
    index: new Map(documents._index),
    ridCount: documents._ridCount,
    lsn: log.lsn,
    byRid: new Map(log.byRid)
  };
}

function restore(documents, state) {
  const log = changeLog(documents);
  documents._data = state.data;
  documents._index = state.index;
  documents._ridCount = state.ridCount;
  log.lsn = state.lsn;
  log.byRid = state.byRid;
}

/** Run one batch operation against the store; returns {statusCode, body}. */
function runBatchOperation(collection, collectionData, pk, rawPk, op) {
  const type = op ? op.operationType : undefined;
  const body = op ? op.resourceBody : undefined;
  const writesBody = ["Create", "Upsert", "Replace"].includes(type);
  if (writesBody && (!body || !keyMatches(collectionData, body, pk.values))) {
    return {
      statusCode: 400,
      body: errorBody("BadRequest", "The partition key of the item does not match the batch's partition key.")
    };
  }
  switch (type) {
    case "Create":
      return documentOperations.createOperation(collection, { resourceBody: body });
    case "Upsert":
      return documentOperations.upsertOperation(collection, {
        partitionKey: rawPk, ifMatch: op.ifMatch, resourceBody: body
      });
    case "Replace":
      if (body.id !== op.id) return { statusCode: 400, body: errorBody("BadRequest", "replace: id mismatch") };
      return documentOperations.replaceOperation(collection, {
        partitionKey: rawPk, ifMatch: op.ifMatch, resourceBody: body
      });
    case "Read":
      return documentOperations.readOperation(collection, { partitionKey: rawPk, id: op.id });
    case "Delete":
      return documentOperations.deleteOperation(collection, { partitionKey: rawPk, ifMatch: op.ifMatch, id: op.id });
    case "Patch":
      return patchOperation(collection, {
        id: op.id,
        partitionKey: rawPk,
        ifMatch: op.ifMatch,
        operations: (body || {}).operations || [],
        condition: (body || {}).condition
      });
    default:
      return { statusCode: 400, body: errorBody("BadRequest", `Operation type '${type}' is not supported in Batch.`) };
  }
}

/**
 * POST .../docs with x-ms-cosmos-is-batch-request. Atomic batches (what the SDK
 * sends) are all-or-nothing: on the first failing operation the container is
 * restored, the response is 207 Multi-Status, the failing operation carries its
 * status and every other one 424 Failed Dependency - as in Cosmos.
 */
async function batchDocuments(account, req, res, { dbId, collId }) {
  const ops = await readJson(req);
  const collection = account.database(dbId).collection(collId);
  const collectionData = collection.read();
  if (!collectionData) {
    res.statusCode = 404;
    return { ...NOT_FOUND };
  }
  if (!Array.isArray(ops) || ops.length === 0 || ops.length > MAX_BATCH_OPERATIONS) {
    res.statusCode = 400;
    return errorBody("BadRequest", `A batch needs 1 to ${MAX_BATCH_OPERATIONS} operations.`);
  }
  const pk = partitionKeyHeader(req);
  if (!pk.present) {
    res.statusCode = 400;
    return errorBody("BadRequest", "A batch needs the x-ms-documentdb-partitionkey header.");
  }
  const definition = partitionDefinition(collectionData);
  if (isHierarchical(definition) && pk.values.length !== definition.paths.length) {
    res.statusCode = 400;
    return errorBody("BadRequest", KEY_MISMATCH);
  }
  const rawPk = isHierarchical(definition)
    ? JSON.stringify([hierarchicalToken(pk.values)])
    : String(req.headers["x-ms-documentdb-partitionkey"]);
  const atomic = trueHeader(req, "x-ms-cosmos-batch-atomic");
  const continueOnError = trueHeader(req, "x-ms-cosmos-batch-continue-on-error");
  const before = atomic ? snapshot(collection.documents) : null;

  const results = [];
  let failedAt = -1;
  for (let i = 0; i < ops.length; i += 1) {
    if (failedAt >= 0 && !continueOnError) {
      results.push({ statusCode: 424, requestCharge: 0 });
      continue;
    }
    let result;
    try {
      result = runBatchOperation(collection, collectionData, pk, rawPk, ops[i]);
    } catch (err) {
      result = { statusCode: 400, body: errorBody("BadRequest", err.message) };
    }
    if (result.statusCode >= 400) {
      if (failedAt < 0) failedAt = i;
      results.push({ statusCode: result.statusCode, requestCharge: 0, resourceBody: result.body });
    } else {
      results.push({
        statusCode: result.statusCode,
        requestCharge: 1,
        eTag: result.body ? result.body._etag : undefined,
        resourceBody: result.body
      });
    }
  }
  if (failedAt >= 0 && atomic) {
    restore(collection.documents, before);
    // In an atomic batch nothing was applied: every other operation is a failed dependency.
    for (let i = 0; i < results.length; i += 1) {
      if (i !== failedAt) results[i] = { statusCode: 424, requestCharge: 0 };
    }
  }
  res.statusCode = failedAt >= 0 ? 207 : 200;
  return results;
}

// ---------------------------------------------------------------------------
// 8. Hierarchical partition keys
// ---------------------------------------------------------------------------

/** The stock store's partition of a document: the full key's token for a MultiHash container. */
function installHierarchicalPartitions() {
  Documents.prototype._getPartition = function partitionOf(data) {
    const definition = partitionDefinition(this._parent.read());
    if (isHierarchical(definition)) return hierarchicalToken(partitionValues(definition, data));
    return Items.prototype._getPartition.call(this, data);
  };
}

/** POST /dbs/{db}/colls: a MultiHash key needs version 2 and 2 to 3 paths, as in Cosmos. */
function withKeyDefinitionCheck(handler) {
  return async (account, req, res, params) => {
    const body = await readJson(req);
    const definition = (body && body.partitionKey) || {};
    if (isHierarchical(definition)) {
      const paths = definition.paths || [];
      if (definition.version !== 2 || paths.length < 2 || paths.length > MAX_KEY_LEVELS) {
        res.statusCode = 400;
        return errorBody(
          "BadRequest",
          `A hierarchical partition key needs version 2 and 2 to ${MAX_KEY_LEVELS} paths (got version ` +
            `${definition.version} and ${paths.length} paths).`
        );
      }
    }
    return handler(account, req, res, params);
  };
}

/**
 * A point operation on a MultiHash container (read, replace, delete, patch,
 * create, upsert): the x-ms-documentdb-partitionkey header must hold the full
 * key, and the document written must have it. The header is then rewritten
 * to the key's token, which the stock handlers look the item up by.
 */
function withHierarchicalKey(handler) {
  return async (account, req, res, params) => {
    const collection = account.database(params.dbId).collection(params.collId);
    const definition = partitionDefinition(collection.read());
    if (!isHierarchical(definition)) return handler(account, req, res, params);
    const pk = partitionKeyHeader(req);
    if (!pk.present || pk.values.length !== definition.paths.length) {
      res.statusCode = 400;
      return errorBody("BadRequest", KEY_MISMATCH);
    }
    if (req.method === "POST" || req.method === "PUT") {
      const body = await readJson(req);
      if (!body || !keyMatches(collection.read(), body, pk.values)) {
        res.statusCode = 400;
        return errorBody("BadRequest", KEY_MISMATCH);
      }
    }
    req.headers["x-ms-documentdb-partitionkey"] = JSON.stringify([hierarchicalToken(pk.values)]);
    return handler(account, req, res, params);
  };
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

const DOC = pathMatch("/dbs/:dbId/colls/:collId/docs/:docId");
const DOCS = pathMatch("/dbs/:dbId/colls/:collId/docs");
const COLLS = pathMatch("/dbs/:dbId/colls");

/** Our handlers, chosen before the stock router (same request classification). */
function customRoute(req, pathname) {
  if (req.method === "GET") {
    const doc = DOC(pathname);
    if (doc) return [doc, readDocument];
    const docs = DOCS(pathname);
    if (docs && req.headers["a-im"]) return [docs, readChangeFeed];
    return undefined;
  }
  if (req.method === "POST") {
    const docs = DOCS(pathname);
    if (!docs) return undefined;
    if (trueHeader(req, "x-ms-documentdb-isquery") || req.headers["content-type"] === "application/query+json") {
      return [docs, queryDocuments];
    }
    if (trueHeader(req, "x-ms-cosmos-is-batch-request")) return [docs, batchDocuments];
  }
  return undefined;
}

/** The hierarchical-key checks a request needs: a container's creation, a point operation. */
function keyChecks(req, pathname, params, handler) {
  if (req.method === "POST" && COLLS(pathname)) return withKeyDefinitionCheck(handler);
  const pointOperation = params.docId
    ? req.method !== "GET" || !req.headers["a-im"]
    : req.method === "POST" && DOCS(pathname) && operationName(req, pathname) !== "query" &&
      operationName(req, pathname) !== "batch";
  return pointOperation && params.collId ? withHierarchicalKey(handler) : handler;
}

/** Give every 404 a Cosmos-style body (the stock handlers answer 404 with `{}`). */
function withCosmosErrors(handler) {
  return async (account, req, res, params) => {
    const body = await handler(account, req, res, params);
    if (res.statusCode === 404 && (!body || !body.code)) return { ...NOT_FOUND };
    return body;
  };
}

let applied = false;

/** Install all patches (idempotent). Must run before the server takes requests. */
function apply() {
  if (applied) return;
  const { version } = JSON.parse(fs.readFileSync(path.join(PKG_DIR, "package.json"), "utf8"));
  if (version !== PINNED_VERSION) {
    throw new Error(
      `patches.js is written for @vercel/cosmosdb-server ${PINNED_VERSION}, found ${version}: run npm ci`
    );
  }
  installChangeLog();
  installHierarchicalPartitions();
  jsonModule.default = readJson; // every stock handler reads the body through it
  const stockRoute = routesModule.default;
  routesModule.default = (req) => {
    const pathname = normalisedPath(req);
    if (pathname.startsWith("/_test/")) return testRoute(req, pathname);
    countRequest(req, pathname);
    const route = customRoute(req, pathname) || stockRoute(req);
    if (!route) return undefined;
    const [params, handler] = route;
    return [params, withCosmosErrors(keyChecks(req, pathname, params, handler))];
  };
  applied = true;
}

module.exports = { apply, effectivePartitionKeyV2, stats, resetStats };
