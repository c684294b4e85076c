// Manager's REST API as the end-to-end suites drive it (hack/manager-e2e.sh): one session,
// the first user registered as Manager's administrator, jobs waited for with their output.
'use strict';

const assert = require('node:assert/strict');

const { waitUntil } = require('./cluster');

/** Manager's REST API with the session of the user who logged in. */
class Manager {
  constructor(url) {
    this.url = url;
    this.cookie = null;
  }

  async call(method, route, body) {
    const res = await fetch(`${this.url}/api/v1${route}`, {
      method,
      headers: { 'content-type': 'application/json', ...(this.cookie ? { cookie: this.cookie } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const setCookie = res.headers.get('set-cookie');
    if (setCookie) this.cookie = setCookie.split(';')[0];
    const text = await res.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = { raw: text };
    }
    return { status: res.status, body: json };
  }

  async ok(method, route, body) {
    const r = await this.call(method, route, body);
    assert.ok(r.status >= 200 && r.status < 300, `${method} ${route}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body.data;
  }

  /** Wait for a job to finish; its status and its whole output. */
  async job(id, timeoutMs = 120_000) {
    const job = await waitUntil(
      `job ${id} to finish`,
      () => this.call('GET', `/jobs/${id}`).then((r) => r.body.data),
      (j) => j && !['pending', 'running'].includes(j.status),
      timeoutMs,
    );
    const rows = await this.ok('GET', `/jobs/${id}/status`);
    return { status: job.status, command: job.command, output: rows.map((r) => r.output).join('') };
  }

  /** Register the first user, whom Manager makes its administrator, and log in as them. */
  async registerAdmin() {
    await this.ok('POST', '/auth/register', { uid: 'admin', givenName: 'Ada', sn: 'Admin', mail: 'admin@example.org', userPassword: 'correct-horse-battery' });
    await this.ok('POST', '/auth/login', { username: 'admin', password: 'correct-horse-battery' });
  }

  /** A site named `name` with its DHCP and DNS settings on the private subnet 10.0.`subnet`.0/24. */
  site(name, subnet) {
    return this.ok('POST', '/sites', {
      name,
      internalDomain: `${name}.internal`,
      dhcpRange: `10.0.${subnet}.100-10.0.${subnet}.200`,
      subnetMask: '255.255.255.0',
      gateway: `10.0.${subnet}.1`,
      dnsForwarders: '8.8.8.8',
    });
  }

  async succeeds(id) {
    const job = await this.job(id);
    assert.equal(job.status, 'success', `${job.command}:\n${job.output}`);
    return job;
  }
}

module.exports = { Manager };
