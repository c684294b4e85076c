// A node's credentials: where they come from, what is refused, and that no error the provider
// makes (which Manager copies into a job's output, read by the container's owner) carries them.
// No cluster: kubeconfig files in a temporary directory, and a local HTTP server standing in for
// an API server that repeats the Authorization header back.
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');
const util = require('util');

const { KubernetesApi, KubeconfigError } = require('..');
const { loadKubeConfig, redact } = require('../lib/kubeconfig');

const TOKEN = 'mw-test-token-5d41402abc4b2a76';
const KEY = 'LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCm13LXRlc3Qta2V5';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mw-kubeconfig-test-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

/** Write `text` to a file of its own; its path. */
let files = 0;
function write(text) {
  const file = path.join(dir, `kubeconfig-${++files}`);
  fs.writeFileSync(file, text, { mode: 0o600 });
  return file;
}

/** A kubeconfig (JSON is YAML) with one cluster, user and context, each part overridable. */
function kubeconfig({ cluster = {}, user = {}, context = {}, extra = {} } = {}) {
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'lab', cluster: { server: 'https://127.0.0.1:6443', ...cluster } }],
    users: [{ name: 'manager', user: { token: TOKEN, ...user } }],
    contexts: [{ name: 'manager', context: { cluster: 'lab', user: 'manager', namespace: 'workloads', ...context } }],
    'current-context': 'manager',
    ...extra,
  });
}

const node = (extra = {}) => ({ id: 7, name: 'k8s', kubeNamespace: 'workloads', ...extra });

/** Everything Manager could print of `err` (console.error(err) shows own properties too). */
function everything(err) {
  return [
    String(err?.message),
    String(err?.stack),
    util.inspect(err, { showHidden: true, depth: null }),
    JSON.stringify(Object.fromEntries(Object.getOwnPropertyNames(Object(err)).map((k) => [k, String(err[k])]))),
  ].join('\n');
}

function assertNoCredential(err, ...secrets) {
  const text = everything(err);
  for (const s of [TOKEN, KEY, ...secrets]) assert.ok(!text.includes(s), `the error repeats a credential: ${text}`);
  assert.equal(err.cause, undefined, 'no cause passed on');
}

/** The error `fn` throws (it must throw). */
function thrown(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  assert.fail('it did not throw');
}

async function rejected(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  assert.fail('it did not reject');
}

describe('a kubeconfig that cannot be used: the file and the problem, never its text', () => {
  // Each a YAML error whose js-yaml message quotes the token: the lines around the fault, a
  // token read as a tag (`!…`) or as an alias (`*…`).
  const broken = {
    'bad indentation': `apiVersion: v1\nusers:\n- name: manager\n  user:\n    token: ${TOKEN}\n   client-key-data: ${KEY}\n`,
    'a token read as a tag': `apiVersion: v1\nusers:\n- name: manager\n  user:\n    token: !${TOKEN}\n`,
    'a token read as an alias': `apiVersion: v1\nusers:\n- name: manager\n  user:\n    token: *${TOKEN}\n`,
  };
  for (const [what, text] of Object.entries(broken)) {
    test(`not valid YAML (${what})`, () => {
      const file = write(text);
      const err = thrown(() => new KubernetesApi(node({ kubeconfigPath: file })));
      assertNoCredential(err);
      assertNoCredential(thrown(() => new KubernetesApi(node(), { kubeconfig: text })));
      assert.ok(err instanceof KubeconfigError, `a KubeconfigError, not ${err.name}`);
      assert.match(err.message, new RegExp(`^kubeconfig ${file}: not valid YAML at line \\d+, column \\d+$`));
    });
  }

  test('each problem named', () => {
    const cases = [
      [node({ kubeconfigPath: path.join(dir, 'missing') }), /^kubeconfig \S+\/missing: file not readable: ENOENT$/],
      [node({ kubeconfigPath: write(kubeconfig()), kubeContext: 'lab2' }), /: no context named "lab2" \(the node's kubeContext\)$/],
      [node({ kubeconfigPath: write(kubeconfig({ extra: { 'current-context': 'gone' } })) }), /: no context named "gone" \(its current-context\)$/],
      [node({ kubeconfigPath: write(kubeconfig({ extra: { 'current-context': undefined } })) }), /: no current context/],
      [node({ kubeconfigPath: write(kubeconfig({ context: { cluster: 'other' } })) }), /: context "manager" names cluster "other", which it does not have$/],
      [node({ kubeconfigPath: write('') }), /: not a kubeconfig/],
      [node({ kubeconfigPath: write(TOKEN) }), /: no current context/],
      [node({ kubeconfigPath: write(kubeconfig({ user: { token: undefined, 'token-file': '/nonexistent/token' } })) }), /: a file it names is not readable: ENOENT$/],
    ];
    for (const [n, expected] of cases) {
      const err = thrown(() => new KubernetesApi(n));
      assertNoCredential(err);
      assert.ok(err instanceof KubeconfigError, `${n.kubeconfigPath}: a KubeconfigError, not ${err.name}: ${err.message}`);
      assert.match(err.message, expected);
    }
  });

  test('a usable one: its context, and the namespace from the node', () => {
    const file = write(kubeconfig({ extra: { 'current-context': 'decoy', contexts: [
      { name: 'decoy', context: { cluster: 'lab', user: 'manager' } },
      { name: 'manager', context: { cluster: 'lab', user: 'manager', namespace: 'workloads' } },
    ] } }));
    const api = new KubernetesApi(node({ kubeconfigPath: file, kubeContext: 'manager', kubeNamespace: 'apps' }));
    assert.equal(api.kc.getCurrentContext(), 'manager');
    assert.equal(api.namespace, 'apps');
    assert.equal(new KubernetesApi(node({ kubeconfigPath: file, kubeContext: 'manager', kubeNamespace: null })).namespace, 'workloads');
  });
});

describe('no ambient credentials', () => {
  const saved = {};
  before(() => {
    // What loadFromDefault would take: $KUBECONFIG, ~/.kube/config, a Pod's address.
    for (const k of ['KUBECONFIG', 'HOME', 'KUBERNETES_SERVICE_HOST', 'KUBERNETES_SERVICE_PORT']) saved[k] = process.env[k];
    const home = path.join(dir, 'home');
    fs.mkdirSync(path.join(home, '.kube'), { recursive: true });
    fs.writeFileSync(path.join(home, '.kube', 'config'), kubeconfig());
    process.env.KUBECONFIG = write(kubeconfig());
    process.env.HOME = home;
    delete process.env.KUBERNETES_SERVICE_HOST;
    delete process.env.KUBERNETES_SERVICE_PORT;
  });
  after(() => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });

  test('a node without kubeconfigPath is refused, naming the field, though $KUBECONFIG and ~/.kube/config exist', () => {
    const err = thrown(() => new KubernetesApi(node(), { env: {} }));
    assert.ok(err instanceof KubeconfigError, `a KubeconfigError, not ${err.name}`);
    assert.match(err.message, /^node k8s has no kubeconfigPath: .*MW_KUBECONFIG_IN_CLUSTER=1/);
  });

  test('MW_KUBECONFIG_IN_CLUSTER=1: the ServiceAccount, only in a Pod, never with a kubeContext', () => {
    const env = { MW_KUBECONFIG_IN_CLUSTER: '1' };
    assert.throws(() => new KubernetesApi(node(), { env }), /MW_KUBECONFIG_IN_CLUSTER=1, but Manager does not run in a Pod/);
    assert.throws(() => new KubernetesApi(node({ kubeContext: 'lab' }), { env }), /kubeContext "lab" needs a kubeconfigPath/);

    const root = path.join(dir, 'pod');
    const sa = path.join(root, 'var/run/secrets/kubernetes.io/serviceaccount');
    fs.mkdirSync(sa, { recursive: true });
    fs.writeFileSync(path.join(sa, 'token'), TOKEN);
    fs.writeFileSync(path.join(sa, 'namespace'), 'manager-system');
    process.env.KUBERNETES_SERVICE_HOST = '10.96.0.1';
    process.env.KUBERNETES_SERVICE_PORT = '443';
    try {
      const { kc } = loadKubeConfig(node(), { env, pathPrefix: root });
      assert.equal(kc.getCurrentCluster().server, 'https://10.96.0.1:443');
      assert.equal(kc.getCurrentCluster().caFile, path.join(sa, 'ca.crt'));
      // Without the opt-in the same Pod's account is not used.
      assert.throws(() => loadKubeConfig(node(), { env: {}, pathPrefix: root }), /has no kubeconfigPath/);
      // A node's own kubeconfig wins over the Pod's.
      assert.equal(loadKubeConfig(node({ kubeconfigPath: write(kubeconfig()) }), { env, pathPrefix: root }).kc.getCurrentCluster().server, 'https://127.0.0.1:6443');
    } finally {
      delete process.env.KUBERNETES_SERVICE_HOST;
      delete process.env.KUBERNETES_SERVICE_PORT;
    }
  });
});

describe('what would run a program, skip TLS verification or use a proxy', () => {
  const exec = { apiVersion: 'client.authentication.k8s.io/v1', command: '/usr/bin/false', interactiveMode: 'Never' };
  const cases = [
    ['exec', { user: { token: undefined, exec } }, /user "manager" has exec \(users\[\]\.user\.exec\).*MW_KUBECONFIG_ALLOW_EXEC=1/, 'MW_KUBECONFIG_ALLOW_EXEC'],
    [
      'auth-provider',
      { user: { token: undefined, 'auth-provider': { name: 'gcp', config: { 'cmd-path': '/usr/bin/false', 'access-token': TOKEN } } } },
      /user "manager" has auth-provider \(users\[\]\.user\.auth-provider\).*MW_KUBECONFIG_ALLOW_AUTH_PROVIDER=1/,
      'MW_KUBECONFIG_ALLOW_AUTH_PROVIDER',
    ],
    [
      'insecure-skip-tls-verify',
      { cluster: { 'insecure-skip-tls-verify': true } },
      /cluster "lab" has insecure-skip-tls-verify: true \(clusters\[\]\.cluster\.insecure-skip-tls-verify\).*MW_KUBECONFIG_ALLOW_INSECURE_TLS=1/,
      'MW_KUBECONFIG_ALLOW_INSECURE_TLS',
    ],
  ];
  for (const [field, parts, expected, optIn] of cases) {
    test(`${field}: refused, naming the field and the opt-in; accepted with ${optIn}=1`, () => {
      const file = write(kubeconfig(parts));
      const err = thrown(() => new KubernetesApi(node({ kubeconfigPath: file }), { env: {} }));
      assert.ok(err instanceof KubeconfigError, `a KubeconfigError, not ${err.name}`);
      assert.match(err.message, new RegExp(`^kubeconfig ${file}: `));
      assert.match(err.message, expected);
      assertNoCredential(err);
      // Another opt-in is not this one.
      const others = Object.fromEntries(cases.map((c) => c[3]).filter((v) => v !== optIn).map((v) => [v, '1']));
      assert.throws(() => new KubernetesApi(node({ kubeconfigPath: file }), { env: others }), expected);
      assert.throws(() => new KubernetesApi(node({ kubeconfigPath: file }), { env: { [optIn]: 'true' } }), expected, 'only 1 opts in');
      new KubernetesApi(node({ kubeconfigPath: file }), { env: { [optIn]: '1' } });
    });
  }

  test('proxy-url: refused whatever the opt-ins', () => {
    const file = write(kubeconfig({ cluster: { 'proxy-url': 'http://proxy.example:3128' } }));
    const all = { MW_KUBECONFIG_ALLOW_EXEC: '1', MW_KUBECONFIG_ALLOW_AUTH_PROVIDER: '1', MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1' };
    const err = thrown(() => new KubernetesApi(node({ kubeconfigPath: file }), { env: all }));
    assert.ok(err instanceof KubeconfigError, `a KubeconfigError, not ${err.name}`);
    assert.match(err.message, /cluster "lab" has proxy-url \(clusters\[\]\.cluster\.proxy-url\).*remove it/);
  });

  test('only the context in use is judged', () => {
    const text = kubeconfig({
      extra: {
        users: [
          { name: 'manager', user: { token: TOKEN } },
          { name: 'admin', user: { exec } },
        ],
      },
    });
    new KubernetesApi(node({ kubeconfigPath: write(text) }), { env: {} });
  });
});

describe('errors of API calls carry no credential', () => {
  let server;
  let base;
  before(async () => {
    // An API server (or something in front of one) that repeats the credential it was sent.
    server = http.createServer((req, res) => {
      const auth = req.headers.authorization || '';
      if (req.url.endsWith('/managedworkloads/new')) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ kind: 'Status', code: 404, message: 'not found' }));
        return;
      }
      if (req.url.includes('/secrets/')) {
        res.writeHead(500, { 'content-type': 'text/html' });
        res.end(`<html>upstream rejected ${auth}</html>`);
        return;
      }
      res.writeHead(403, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ kind: 'Status', code: 403, message: `forbidden: credential ${auth.replace(/^Bearer /, '')} has no access` }));
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${server.address().port}`;
  });
  after(() => server.close());

  // Plain HTTP needs insecure-skip-tls-verify, and so its opt-in.
  const env = { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1', MW_KUBECONFIG_ALLOW_EXEC: '1' };
  const apiTo = (cluster, user = {}, lines = []) =>
    new KubernetesApi(node(), { kubeconfig: kubeconfig({ cluster: { 'insecure-skip-tls-verify': true, ...cluster }, user }), env, log: (l) => lines.push(l) });

  test("the API server's answer, JSON or not", async () => {
    const lines = [];
    const api = apiTo({ server: base }, {}, lines);
    let err = await rejected(api.lxcConfig('k8s', 'workloads/web'));
    assert.match(err.message, /^reading workloads\/web: Kubernetes API 403: forbidden: credential \[redacted\] has no access$/);
    assert.equal(err.code, 403);
    assertNoCredential(err);
    err = await rejected(api.createLxc('k8s', { containerId: 1, hostname: 'new', image: 'nginx' }));
    assert.match(err.message, /^reading Secret workloads\/new-manager-env: Kubernetes API 500: <html>upstream rejected Bearer \[redacted\]<\/html>$/);
    assertNoCredential(err);
    assert.ok(!lines.join('\n').includes(TOKEN), 'nor in a log line');
  });

  test('a password in the server URL', async () => {
    const err = await rejected(apiTo({ server: `http://manager:${TOKEN}@127.0.0.1:1` }).clusterResources('lxc'));
    assert.match(err.message, /^listing workloads's workloads: request to http:\/\/\[redacted\]@127\.0\.0\.1:1\//);
    assertNoCredential(err);
  });

  test("an exec plugin's output (opted in)", async () => {
    // A plugin that prints a bare token, not an ExecCredential; and one that fails saying it.
    const execToken = 'mw-exec-token-0cc175b9c0f1b6a8';
    const plugin = (script) => ({ token: undefined, exec: { apiVersion: 'client.authentication.k8s.io/v1', command: process.execPath, args: ['-e', script] } });
    let err = await rejected(apiTo({ server: base }, plugin(`process.stdout.write(${JSON.stringify(execToken)})`)).lxcConfig('k8s', 'workloads/web'));
    assert.equal(err.message, 'reading workloads/web: an answer was not valid JSON');
    assertNoCredential(err, execToken);
    err = await rejected(apiTo({ server: base }, plugin(`process.stderr.write("token: ${execToken}"); process.exit(1)`)).lxcConfig('k8s', 'workloads/web'));
    assert.match(err.message, /^reading workloads\/web: token: \[redacted\]/);
    assertNoCredential(err, execToken);
  });
});

test('redact: the values given, and what looks like a credential', () => {
  const jwt = 'eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJtYW5hZ2VyIn0.c2lnbmF0dXJl';
  const key = '-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIK\n-----END EC PRIVATE KEY-----';
  const text = [
    `exact ${TOKEN}`,
    'Authorization: Bearer abc.def-ghi',
    'Basic dXNlcjpwYXNz',
    'token: plain-token-value',
    '"token":"json-token-value"',
    'client-key-data: c2VjcmV0LWtleQ==',
    'password=hunter22',
    `jwt ${jwt}`,
    key,
    'https://user:p4ss@example.org/x',
  ].join('\n');
  const out = redact(text, [TOKEN]);
  for (const s of [TOKEN, 'abc.def-ghi', 'dXNlcjpwYXNz', 'plain-token-value', 'json-token-value', 'c2VjcmV0LWtleQ==', 'hunter22', jwt, 'MHcCAQEEIK', 'p4ss']) {
    assert.ok(!out.includes(s), `${s} left in: ${out}`);
  }
  // Ordinary words stay.
  assert.equal(redact('reading workloads/web: Kubernetes API 404: not found'), 'reading workloads/web: Kubernetes API 404: not found');
  assert.match(out, /^exact \[redacted\]$/m);
});
