// checkNode, what the patch's nodes router asks before it saves a kubernetes node, against a
// local HTTP server standing in for the API server: each refusal names the node's field and
// keeps the API server's words, and none repeats a credential (the server echoes the token).
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const http = require('http');
const net = require('net');

const { checkNode, NodeCheckError } = require('..');

const TOKEN = 'tok-8f3a9c1e5b7d2f4a6c8e0b1d3f5a7c9e';
const ENV = { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1' };
const LIST = '/apis/opensource-server.mieweb.org/v1alpha1/namespaces/apps/managedworkloads';

/** A kubeconfig for `server`, whose user's token is TOKEN. */
const kubeconfig = (server, context = 'manager') =>
  JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'lab', cluster: { server, 'insecure-skip-tls-verify': true } }],
    users: [{ name: 'manager', user: { token: TOKEN } }],
    contexts: [{ name: context, context: { cluster: 'lab', user: 'manager' } }],
    'current-context': context,
  });

/**
 * The API server. `answer.list`, `answer.namespace`: [status, message] for the list of workloads
 * and the read of the namespace (default 200); `answer.denied`: "verb resource" pairs a
 * SelfSubjectAccessReview refuses; `answer.reviews`: [status, message] for asking at all;
 * `answer.hang`: never answer. `asked` holds each review's attributes.
 */
function apiServer() {
  const state = { answer: {}, asked: [] };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      if (state.answer.hang) return;
      const send = (code, obj) => {
        res.writeHead(code, { 'content-type': 'application/json' });
        res.end(JSON.stringify(obj));
      };
      const status = ([code, message]) => send(code, { kind: 'Status', apiVersion: 'v1', status: 'Failure', code, message });
      const url = req.url.split('?')[0];
      if (url === LIST) {
        if (state.answer.list) return status(state.answer.list);
        return send(200, { apiVersion: 'opensource-server.mieweb.org/v1alpha1', kind: 'ManagedWorkloadList', metadata: {}, items: [] });
      }
      if (url === '/api/v1/namespaces/apps') {
        if (state.answer.namespace) return status(state.answer.namespace);
        return send(200, { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'apps' } });
      }
      if (url === '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews' && req.method === 'POST') {
        if (state.answer.reviews) return status(state.answer.reviews);
        const review = JSON.parse(body);
        const a = review.spec.resourceAttributes;
        state.asked.push(a);
        const allowed = !(state.answer.denied || []).includes(`${a.verb} ${a.resource}`);
        return send(201, { ...review, status: { allowed, ...(allowed ? {} : { reason: `no RBAC policy matched; ${TOKEN}` }) } });
      }
      return status([404, 'the server could not find the requested resource']);
    });
  });
  return { server, state };
}

/** The NodeCheckError `checkNode(node)` rejects with; fails when it resolves or throws another. */
async function refusal(node, opts) {
  const err = await checkNode(node, { env: ENV, ...opts }).then(
    () => assert.fail('checkNode resolved'),
    (e) => e,
  );
  assert.ok(err instanceof NodeCheckError, `${err.name}: ${err.message}`);
  // What Manager's API error handler sends: 400, the code, the message on its field.
  assert.deepEqual([err.status, err.fields], [400, { [err.field]: err.message }]);
  assert.ok(!err.message.includes(TOKEN), `the token in: ${err.message}`);
  return err;
}

describe('checkNode against a fake API server', () => {
  const { server, state } = apiServer();
  let url;
  const node = { name: 'k8s', kubeNamespace: 'apps' };
  const check = (answer, opts = {}) => {
    state.answer = answer;
    state.asked.length = 0;
    return refusal(node, { kubeconfig: kubeconfig(url), ...opts });
  };

  before(async () => {
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${server.address().port}`;
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test('all there: resolves, having asked about every permission of rbac/role.yaml in the namespace', async () => {
    state.answer = {};
    state.asked.length = 0;
    await checkNode(node, { kubeconfig: kubeconfig(url), env: ENV });
    const asked = state.asked.map((a) => `${a.namespace} ${a.group}/${a.resource} ${a.verb}`).sort();
    const workloads = ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'].map((v) => `apps opensource-server.mieweb.org/managedworkloads ${v}`);
    const secrets = ['create', 'get', 'update'].map((v) => `apps /secrets ${v}`);
    assert.deepEqual(asked, [...secrets, ...workloads].sort());
  });

  test('credentials refused (401): kubeconfigPath, in the API server’s words', async () => {
    const err = await check({ list: [401, 'Unauthorized'] });
    assert.deepEqual([err.code, err.field], ['kube_unauthorized', 'kubeconfigPath']);
    assert.equal(err.message, `listing managedworkloads in namespace apps at ${url}: Kubernetes API 401: Unauthorized`);
  });

  test('not allowed in the namespace (403): kubeNamespace, the API server’s words and what to check', async () => {
    const words = 'managedworkloads.opensource-server.mieweb.org is forbidden: User "system:serviceaccount:apps:manager" cannot list resource "managedworkloads" in API group "opensource-server.mieweb.org" in the namespace "apps"';
    const err = await check({ list: [403, words] });
    assert.deepEqual([err.code, err.field], ['kube_forbidden', 'kubeNamespace']);
    assert.ok(err.message.includes(`Kubernetes API 403: ${words}; is namespace apps there, with rbac/role.yaml bound in it`), err.message);
  });

  test('no ManagedWorkloads served (404 on the list): kubeconfigPath, the CRD named', async () => {
    const err = await check({ list: [404, 'the server could not find the requested resource'] });
    assert.deepEqual([err.code, err.field], ['kube_crd_missing', 'kubeconfigPath']);
    assert.match(err.message, /Kubernetes API 404: the server could not find the requested resource; is mw-operator's CRD installed in that cluster\?$/);
  });

  test('an API server in trouble (503): kubeconfigPath, unreachable', async () => {
    const err = await check({ list: [503, `etcdserver: request timed out (request with token ${TOKEN})`] });
    assert.deepEqual([err.code, err.field], ['kube_unreachable', 'kubeconfigPath']);
    assert.match(err.message, /Kubernetes API 503: etcdserver: request timed out \(request with token \[redacted\]\)$/);
  });

  test('no such namespace (an identity allowed everywhere lists an empty one): kubeNamespace', async () => {
    const err = await check({ namespace: [404, 'namespaces "apps" not found'] });
    assert.deepEqual([err.code, err.field], ['kube_namespace_not_found', 'kubeNamespace']);
    assert.equal(err.message, 'reading namespace apps: Kubernetes API 404: namespaces "apps" not found');
  });

  test('an identity that may not read namespaces (403) but may list in this one: accepted', async () => {
    state.answer = { namespace: [403, 'namespaces "apps" is forbidden'] };
    await checkNode(node, { kubeconfig: kubeconfig(url), env: ENV });
  });

  test('a permission of the Role missing: kubeNamespace, each one named, the reviewer’s reason without the token', async () => {
    const err = await check({ denied: ['delete managedworkloads', 'update secrets'] });
    assert.deepEqual([err.code, err.field], ['kube_forbidden', 'kubeNamespace']);
    assert.match(err.message, /^Manager's identity at \S+ may not delete managedworkloads \(no RBAC policy matched; \[redacted\]\), update secrets \(.*\) in namespace apps: bind rbac\/role\.yaml to it there$/);
  });

  test('an identity that may not even ask what it may do (403): kubeNamespace, in the API server’s words', async () => {
    const words = 'selfsubjectaccessreviews.authorization.k8s.io is forbidden: User "manager" cannot create resource "selfsubjectaccessreviews"';
    const err = await check({ reviews: [403, words] });
    assert.deepEqual([err.code, err.field], ['kube_forbidden', 'kubeNamespace']);
    assert.match(err.message, /^asking whether Manager's identity may \w+ \w+ in namespace apps: Kubernetes API 403: selfsubjectaccessreviews/);
  });

  test('no answer: given up on after the time limit, kubeconfigPath', async () => {
    const started = Date.now();
    const err = await check({ hang: true }, { timeoutMs: 300 });
    assert.deepEqual([err.code, err.field], ['kube_unreachable', 'kubeconfigPath']);
    assert.match(err.message, /: no answer within 0\.3 s$/);
    assert.ok(Date.now() - started < 5000, 'not the socket timeout');
  });
});

describe('checkNode without an API server', () => {
  test('a port nothing listens on: kubeconfigPath, with the connection error', async () => {
    const free = await new Promise((resolve) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = s.address();
        s.close(() => resolve(port));
      });
    });
    const err = await refusal({ name: 'k8s', kubeNamespace: 'apps' }, { kubeconfig: kubeconfig(`http://127.0.0.1:${free}`) });
    assert.deepEqual([err.code, err.field], ['kube_unreachable', 'kubeconfigPath']);
    assert.match(err.message, /ECONNREFUSED/);
  });

  test("a kubeconfig the provider refuses: the field at fault (kubeContext when it names what the file lacks)", async () => {
    let err = await refusal({ name: 'k8s', kubeContext: 'lab', kubeNamespace: 'apps' }, { kubeconfig: kubeconfig('http://127.0.0.1:9') });
    assert.deepEqual([err.code, err.field], ['invalid_kubeconfig', 'kubeContext']);
    assert.match(err.message, /no context named "lab" \(the node's kubeContext\)/);
    err = await refusal({ name: 'k8s', kubeconfigPath: '/nonexistent/k8s.kubeconfig', kubeNamespace: 'apps' });
    assert.deepEqual([err.code, err.field], ['invalid_kubeconfig', 'kubeconfigPath']);
    assert.match(err.message, /^kubeconfig \/nonexistent\/k8s\.kubeconfig: file not readable: ENOENT$/);
    // TLS verification off without Manager's opt-in.
    err = await refusal({ name: 'k8s', kubeNamespace: 'apps' }, { kubeconfig: kubeconfig('http://127.0.0.1:9'), env: {} });
    assert.deepEqual([err.code, err.field], ['invalid_kubeconfig', 'kubeconfigPath']);
    assert.match(err.message, /insecure-skip-tls-verify/);
  });

  test('no namespace: kubeNamespace', async () => {
    const err = await refusal({ name: 'k8s', kubeconfigPath: '/etc/k8s.kubeconfig' });
    assert.deepEqual([err.code, err.field], ['invalid_kube_namespace', 'kubeNamespace']);
  });
});
