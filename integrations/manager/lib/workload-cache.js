'use strict';
// A node's workloads as Manager's pages read them: listed once, then kept current by a watch.
//
// Manager resolves every container's status on each read of its containers (the list page,
// one container's page) through the node's clusterResources('lxc'): one call per node, none
// per container (utils/container-status.js). A list of the node's ManagedWorkloads for each
// page load costs the API server, and Manager's server, the whole list every time: about 8 KiB
// of JSON per workload to encode and to parse, 8 MiB with 1,000 workloads. Here one list fills
// a table of what Manager reads (a few short strings per workload), a watch keeps it current,
// and a page load reads the table: no request to the API server, whatever the number of
// workloads (docs/performance.md, "Manager's container list at 1,000 containers").
//
// - What it shows trails the API server by the watch's delivery (milliseconds). A watch that
//   fails (the API server gone, 410 Gone, a refusal) or outlives its timeout without a word (a
//   connection cut silently) ends the table: the next read lists again, and its error, if any,
//   is Manager's `unknown` as before.
// - The API server ends each watch after WATCH_SECONDS; it is resumed from where it was, unless
//   nobody read the table for IDLE_MS: then the table is dropped, connection and memory with it.
// - The watch's connection never keeps a process alive: a process that reads once (a job, the
//   README's check) ends when its work does.
// - One table per node and credentials: a new kubeconfig (a rotated token) starts its own.
// - The watch is a plain request, not @kubernetes/client-node's Watch (1.x): that one's
//   connection (node-fetch, through an agent it makes and keeps to itself) cannot be told not
//   to hold the process open, and it drops an event it cannot parse without a word.

const crypto = require('crypto');
const http = require('http');
const https = require('https');
const readline = require('readline');

const m = require('./mapping');

const { conditionAt } = m;

/** How the tables behave; the tests shorten them. */
const timing = {
  /** A table nobody read for this long is dropped at its watch's next renewal. */
  idleMs: 5 * 60_000,
  /** How long the API server keeps one watch open before it ends it (timeoutSeconds). */
  watchSeconds: 60,
  /** A watch still open this long after its timeout was cut without a word. */
  graceMs: 30_000,
};

/** The tables, by node and credentials (WorkloadCache.key). */
const caches = new Map();

/** What Manager reads of one workload (clusterResources' entry, without the node's name). */
function summary(mw) {
  const managerStatus = m.managerStatus(mw);
  const generation = mw.metadata.generation;
  const stalled = conditionAt(mw, 'Stalled', generation);
  const cause = stalled?.status === 'True' ? stalled : conditionAt(mw, 'Reconciling', generation);
  return {
    vmid: `${mw.metadata.namespace}/${mw.metadata.name}`,
    name: mw.metadata.name,
    type: 'lxc',
    status: managerStatus === 'running' ? 'running' : 'stopped',
    managerStatus,
    reason: cause?.status === 'True' ? cause.reason : null,
  };
}

class WorkloadCache {
  /**
   * The key of a node's table: its id, namespace and selector, and a digest of the cluster and
   * user its kubeconfig gives (never the credentials themselves).
   */
  static key(nodeId, namespace, labelSelector, kc) {
    const who = JSON.stringify([kc.getCurrentCluster(), kc.getCurrentUser()]);
    return [nodeId, namespace, labelSelector, crypto.createHash('sha256').update(who).digest('hex')].join('\0');
  }

  /**
   * The node's workloads' summaries, from its table (made, by one list, if there is none).
   * @param {string} key WorkloadCache.key(...)
   * @param {() => object} init what a new table needs: kc, namespace, labelSelector, and
   *   list(), the provider's list of the node's workloads (its errors already explained)
   */
  static async read(key, init) {
    let cache = caches.get(key);
    if (cache && !cache.#fresh()) cache.#close();
    cache = caches.get(key);
    if (!cache) {
      cache = new WorkloadCache(key, init());
      caches.set(key, cache);
    }
    return cache.#read();
  }

  /** Every table's watch stopped and the tables dropped (tests). */
  static closeAll() {
    for (const cache of [...caches.values()]) cache.#close();
  }

  /** How many tables there are (tests). */
  static get size() {
    return caches.size;
  }

  #key;
  #kc;
  #namespace;
  #labelSelector;
  #list;
  /** name → summary */
  #items = new Map();
  #resourceVersion = null;
  /** The first list, awaited by every read. */
  #ready = null;
  #lastRead = 0;
  /** The watch request in flight, its start, and a number that tells its callbacks from an older one's. */
  #request = null;
  #watchStarted = 0;
  #watchId = 0;
  #closed = false;

  constructor(key, { kc, namespace, labelSelector, list }) {
    this.#key = key;
    this.#kc = kc;
    this.#namespace = namespace;
    this.#labelSelector = labelSelector;
    this.#list = list;
  }

  async #read() {
    this.#lastRead = Date.now();
    this.#ready ??= this.#sync();
    try {
      await this.#ready;
    } catch (err) {
      // The list failed: no table, and the next read lists again.
      this.#close();
      throw err;
    }
    return [...this.#items.values()];
  }

  async #sync() {
    const list = await this.#list();
    this.#items = new Map(list.items.map((mw) => [mw.metadata.name, summary(mw)]));
    this.#resourceVersion = list.metadata?.resourceVersion;
    this.#watch();
  }

  /** Not cut silently: no watch open longer than the API server keeps one. */
  #fresh() {
    return !this.#request || Date.now() - this.#watchStarted <= timing.watchSeconds * 1000 + timing.graceMs;
  }

  /**
   * No more watching, and out of the map: the next read makes a new table. A read already under
   * way still answers from this one (its memory goes with the last such read).
   */
  #close() {
    this.#closed = true;
    this.#stopWatch();
    if (caches.get(this.#key) === this) caches.delete(this.#key);
  }

  #stopWatch() {
    this.#watchId += 1;
    this.#request?.destroy();
    this.#request = null;
  }

  /** Watch from the table's resourceVersion; every change lands in the table. */
  #watch() {
    if (this.#closed) return;
    const id = ++this.#watchId;
    const cluster = this.#kc.getCurrentCluster();
    const url = new URL(`${cluster.server.replace(/\/+$/, '')}/apis/${m.GROUP}/${m.VERSION}/namespaces/${encodeURIComponent(this.#namespace)}/${m.PLURAL}`);
    url.searchParams.set('watch', 'true');
    url.searchParams.set('labelSelector', this.#labelSelector);
    url.searchParams.set('resourceVersion', this.#resourceVersion);
    url.searchParams.set('allowWatchBookmarks', 'true');
    url.searchParams.set('timeoutSeconds', String(timing.watchSeconds));
    this.#watchStarted = Date.now();
    // The same TLS settings and credentials as every other request of the provider.
    const opts = {};
    this.#kc.applyToHTTPSOptions(opts).then(
      () => {
        if (id !== this.#watchId) return;
        const headers = { ...opts.headers, accept: 'application/json' };
        if (opts.auth) headers.authorization = `Basic ${Buffer.from(opts.auth).toString('base64')}`;
        const request = (url.protocol === 'https:' ? https : http).request(url, { method: 'GET', agent: opts.agent, headers });
        this.#request = request;
        // The watch waits for events; it is no reason for the process to stay.
        request.on('socket', (socket) => socket.unref());
        request.on('error', (err) => this.#ended(id, err));
        request.on('response', (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            this.#ended(id, new Error(`watch answered ${res.statusCode}`));
            return;
          }
          const lines = readline.createInterface({ input: res, crlfDelay: Infinity });
          lines.on('line', (line) => this.#event(id, line));
          // A connection cut (or destroyed here) fails the answer, and readline says so too.
          res.on('error', (err) => this.#ended(id, err));
          lines.on('error', (err) => this.#ended(id, err));
          lines.on('close', () => this.#ended(id, null));
        });
        request.end();
      },
      (err) => this.#ended(id, err),
    );
  }

  #event(id, line) {
    if (id !== this.#watchId || !line.trim()) return;
    let event;
    try {
      event = JSON.parse(line);
    } catch {
      this.#ended(id, new Error('a watch event was not JSON'));
      return;
    }
    const obj = event.object;
    switch (event.type) {
      case 'ADDED':
      case 'MODIFIED':
        this.#items.set(obj.metadata.name, summary(obj));
        break;
      case 'DELETED':
        this.#items.delete(obj.metadata.name);
        break;
      case 'BOOKMARK':
        break;
      default:
        // ERROR: 410 Gone (too old to resume from), or the like. A fresh list at the next read.
        this.#ended(id, new Error(`watch error: ${obj?.message || event.type}`));
        return;
    }
    if (obj?.metadata?.resourceVersion) this.#resourceVersion = obj.metadata.resourceVersion;
  }

  /** The watch ended: resumed if the API server ended it and someone still reads the table. */
  #ended(id, err) {
    if (id !== this.#watchId) return;
    this.#stopWatch();
    if (err || Date.now() - this.#lastRead > timing.idleMs) this.#close();
    else this.#watch();
  }
}

module.exports = { WorkloadCache, summary, timing };
