// Manager's users reach their containers through the site's agent: nginx proxying HTTP by Host
// header and SSH as a stream to `<ipv4Address>:<internalPort>`. This suite sends requests along
// that path to Kubernetes containers on the real node, and keeps sending them through a
// rollout and a restart.
//
// Manager's own code: server.js and job-runner.js (patched: hack/manager-e2e.sh); the agent
// (agent/ in Manager's tree, built and installed by its own Makefile) and the nginx it renders,
// tests and reloads through systemd over D-Bus; Manager's environment.service. They run as
// Manager's images/agent does, in a Debian 13 system container (hack/systemd-image.sh agent),
// here a privileged ManagedWorkload on the real node (the node's cgroup v1 gives systemd a
// writable cgroup only so). What stands in: the agent's TLS certificate (self-signed, for
// agent.mw-test.invalid, where Manager's image asks an ACME CA) and the client, this test, which
// dials the agent's Pod IP as a user's DNS would send them to the agent's host.
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const https = require('node:https');
const path = require('node:path');
const { promisify } = require('node:util');

const m = require('../lib/mapping');
const { Cluster, waitUntil } = require('../testing/cluster');
const { Manager } = require('../testing/manager');

const { MANAGER_URL, MANAGER_LOGS, MW_TEST_KUBECONFIG, MW_E2E_STORAGE_CLASS, MW_AGENT_MANAGER_URL } = process.env;
const realNode = process.env.MW_TEST_REAL_NODE === '1';
// The domain hack/systemd-image.sh made the agent image's certificate for.
const DOMAIN = 'agent.mw-test.invalid';
// The agent checks in 30 s after it starts, then every 30 s (its systemd timer).
const AGENT_PASS_MS = 150_000;

/** GET https://HOSTNAME.DOMAIN/ through the agent at `ip`: "STATUS BODY", or the error. */
function viaAgent(ip, hostname) {
  const host = `${hostname}.${DOMAIN}`;
  return new Promise((resolve) => {
    const req = https.request(
      // The certificate is self-signed; the check below is that it is the domain's. A new
      // connection each time: a resumed TLS session shows no certificate.
      { host: ip, port: 443, path: '/', servername: host, headers: { host }, rejectUnauthorized: false, agent: false, timeout: 5000 },
      (res) => {
        const cn = res.socket.getPeerCertificate().subject?.CN;
        let body = '';
        res.on('data', (chunk) => (body += chunk));
        res.on('end', () => resolve(cn === DOMAIN ? `${res.statusCode} ${body.trim()}` : `certificate for ${cn}`));
      },
    );
    req.on('timeout', () => req.destroy(new Error('no answer within 5 s')));
    req.on('error', (err) => resolve(String(err)));
    req.end();
  });
}

/** `ssh -p PORT root@IP COMMAND` with the suite's key: its output, or the error. */
async function ssh(key, ip, port, command) {
  const args = ['-i', key, '-p', String(port), '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5',
    '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'LogLevel=ERROR', `root@${ip}`, command];
  return promisify(execFile)('ssh', args, { timeout: 20_000 }).then(
    ({ stdout }) => stdout.trim(),
    (err) => `failed: ${(err.stderr || err.message).trim()}`,
  );
}

describe("Manager's agent reaches Kubernetes containers: HTTP by Host header, SSH by port", { skip: !realNode && 'needs the real node (MW_TEST_REAL_NODE=1; make test starts it)' }, () => {
  const manager = new Manager(MANAGER_URL);
  const cluster = new Cluster(MW_TEST_KUBECONFIG, 't-manager-agent', { storageClass: MW_E2E_STORAGE_CLASS, capacity: '100Gi', realNode: true });
  const key = path.join(MANAGER_LOGS || '.', 'agent-e2e-key');
  let site;
  let web;
  let shell;
  let agentIp;
  let sshPort;

  before(async () => {
    assert.ok(MANAGER_URL && MANAGER_LOGS && MW_TEST_KUBECONFIG && MW_E2E_STORAGE_CLASS && MW_AGENT_MANAGER_URL, 'run by hack/manager-e2e.sh');
    await cluster.setUp(2);
    const kubeconfig = path.join(MANAGER_LOGS, 'manager-agent.kubeconfig');
    fs.writeFileSync(kubeconfig, await cluster.managerKubeconfig(), { mode: 0o600 });
    fs.rmSync(key, { force: true });
    await promisify(execFile)('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'agent-e2e', '-f', key]);

    await manager.registerAdmin();
    site = await manager.site('e2e-agent', 2);
    const domain = await manager.ok('POST', '/external-domains', { name: DOMAIN, siteId: site.id });
    await manager.ok('POST', `/sites/${site.id}/nodes`, {
      name: 'k8s-agent',
      nodeType: 'kubernetes',
      kubeconfigPath: kubeconfig,
      kubeNamespace: cluster.namespace,
    });

    // The site's agent, deployed by the administrator beside the containers: a remote agent
    // authenticates with an administrator's API key, kept in a Secret.
    const apiKey = await manager.ok('POST', '/apikeys', { description: 'site agent' });
    await cluster.core.createNamespacedSecret({
      namespace: cluster.namespace,
      body: { metadata: { name: 'agent-api-key' }, stringData: { API_KEY: apiKey.key } },
    });
    await cluster.custom.createNamespacedCustomObject({
      group: m.GROUP,
      version: m.VERSION,
      plural: m.PLURAL,
      namespace: cluster.namespace,
      body: {
        apiVersion: `${m.GROUP}/${m.VERSION}`,
        kind: m.KIND,
        metadata: { name: 'agent' },
        spec: {
          image: 'mw-test.invalid/opensource-agent:1',
          hostname: 'agent',
          systemContainer: { privileged: true },
          env: [
            { name: 'SITE_ID', value: String(site.id) },
            { name: 'MANAGER_URL', value: MW_AGENT_MANAGER_URL },
            { name: 'API_KEY', valueFrom: { secretKeyRef: { name: 'agent-api-key', key: 'API_KEY' } } },
            { name: 'LOG_LEVEL', value: 'debug' },
          ],
        },
      },
    });

    // A web server with an HTTP service (web.agent.mw-test.invalid), and an SSH server with a
    // transport service whose external port Manager picks; the user's key comes in its env.
    const madeWeb = await manager.ok('POST', `/sites/${site.id}/containers`, {
      hostname: 'web',
      template: 'custom',
      customTemplate: 'mw-test.invalid/httpd:1',
      services: { 0: { type: 'http', internalPort: 8080, externalHostname: 'web', externalDomainId: domain.id } },
    });
    const madeShell = await manager.ok('POST', `/sites/${site.id}/containers`, {
      hostname: 'shell',
      template: 'custom',
      customTemplate: 'mw-test.invalid/sshd:1',
      environmentVars: [{ key: 'SSH_AUTHORIZED_KEY', value: fs.readFileSync(`${key}.pub`, 'utf8').trim() }],
      services: { 0: { type: 'tcp', internalPort: 22 } },
    });
    await manager.succeeds(madeWeb.jobId);
    await manager.succeeds(madeShell.jobId);
    web = await manager.ok('GET', `/sites/${site.id}/containers/${madeWeb.containerId}`);
    shell = await manager.ok('GET', `/sites/${site.id}/containers/${madeShell.containerId}`);
    sshPort = shell.sshPort;
    assert.ok(sshPort >= 2000, `Manager picked an external port for SSH: ${JSON.stringify(shell.services)}`);

    const agent = await waitUntil(
      'the agent to run',
      () => cluster.workload('agent'),
      (w) => w?.status?.phase === 'Running',
      120_000,
    );
    agentIp = (await cluster.pods('agent'))[0].status.podIP;
    assert.ok(agentIp, JSON.stringify(agent.status));
  });
  after(() => cluster.tearDown());

  test('the agent checks in with its API key and applies nginx', async () => {
    const agents = await waitUntil(
      'the agent to report nginx applied',
      () => manager.ok('GET', '/agents'),
      (list) => list.some((a) => a.siteId === site.id && a.services?.nginx?.lastApply === 'success' && a.services.nginx.state === 'active'),
      AGENT_PASS_MS,
    );
    const agent = agents.find((a) => a.siteId === site.id);
    assert.equal(agent.hostname, 'agent');
    assert.equal(agent.ipv4Address, agentIp, 'it reports its Pod IP');
  });

  test('HTTP by Host header through the agent’s nginx reaches the container’s Service', async () => {
    assert.equal(web.status, 'running');
    const answer = await waitUntil(`https://web.${DOMAIN}/ through the agent`, () => viaAgent(agentIp, 'web'), (a) => a.startsWith('200 '), AGENT_PASS_MS);
    assert.equal(answer, '200 mw-test httpd v1');
    // Another name of the domain reaches no container: nginx's wildcard server for it.
    assert.match(await viaAgent(agentIp, 'nobody'), /^404 /);
  });

  test('SSH through the agent’s stream port runs a command in the container', async () => {
    const out = await waitUntil(`ssh -p ${sshPort} through the agent`, () => ssh(key, agentIp, sshPort, 'hostname'), (o) => !o.startsWith('failed'), AGENT_PASS_MS);
    assert.equal(out, 'shell');
  });

  test('both still answer after a rollout (an env change) and a restart', async () => {
    const webPods = (await cluster.pods('web')).map((p) => p.metadata.uid);
    const put = await manager.ok('PUT', `/sites/${site.id}/containers/${web.id}`, { environmentVars: [{ key: 'GREETING', value: 'hello' }] });
    await manager.succeeds(put.jobId);
    assert.ok((await cluster.pods('web')).every((p) => !webPods.includes(p.metadata.uid)), 'a new Pod');
    const shellPods = (await cluster.pods('shell')).map((p) => p.metadata.uid);
    const restart = await manager.ok('PUT', `/sites/${site.id}/containers/${shell.id}`, { restart: true });
    await manager.succeeds(restart.jobId);
    assert.ok((await cluster.pods('shell')).every((p) => !shellPods.includes(p.metadata.uid)), 'a new Pod');

    // The address Manager stored is the Service's: the agent's configuration did not change.
    assert.equal((await manager.ok('GET', `/sites/${site.id}/containers/${web.id}`)).ipv4Address, web.ipv4Address);
    assert.equal((await manager.ok('GET', `/sites/${site.id}/containers/${shell.id}`)).ipv4Address, shell.ipv4Address);
    assert.equal(await waitUntil('web through the agent', () => viaAgent(agentIp, 'web'), (a) => a.startsWith('200 '), 30_000), '200 mw-test httpd v1');
    assert.equal(await waitUntil('ssh through the agent', () => ssh(key, agentIp, sshPort, 'hostname'), (o) => !o.startsWith('failed'), 30_000), 'shell');
  });

  test('a deleted container leaves the agent’s configuration at its next check-in', async () => {
    await manager.ok('DELETE', `/sites/${site.id}/containers/${web.id}`);
    const answer = await waitUntil('web to be gone from the agent', () => viaAgent(agentIp, 'web'), (a) => a.startsWith('404 '), AGENT_PASS_MS);
    assert.match(answer, /^404 /);
  });
});
