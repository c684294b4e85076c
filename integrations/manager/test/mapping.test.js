// The provider's half of "one mapping, not two": every case of ../mapping-cases.json, mapped
// from what Manager's create job passes the provider, must be exactly the workload the table
// says, which the bridge's cargo test checks for the same rows. Plus the pure helpers.
'use strict';

const { describe, test } = require('node:test');
const assert = require('node:assert/strict');

const m = require('../lib/mapping');
const { rootfsGb } = require('../lib/kubernetes-api');

const { table, managerCall } = require('../testing/cases');

describe('the shared mapping table', () => {
  for (const c of table.cases) {
    test(c.name, () => {
      assert.ok(c.expect, 'the case has its expectation');
      const { workload, secret, env } = m.desired({ ...managerCall(c), namespace: c.context.namespace, nodeId: c.row.nodeId }, c.context);
      assert.deepEqual(workload.spec, c.expect.spec);
      const { [m.PROVIDER_LABEL]: mark, ...identity } = workload.metadata.labels;
      assert.equal(mark, m.PROVIDER_VALUE);
      assert.deepEqual(identity, c.expect.labels);
      assert.equal(secret.metadata.name, c.expect.secretName);
      assert.deepEqual(env, c.expect.env);
      const decoded = Object.fromEntries(Object.entries(secret.data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
      assert.deepEqual(decoded, c.expect.env);
      assert.ok(!JSON.stringify(workload).includes('s3cr=t'), 'no env value in the CR');
    });
  }
});

describe('pure parts', () => {
  test('entrypoints split as the shell-words crate splits them', () => {
    assert.deepEqual(m.shellSplit(`/bin/sh -c 'echo "a b" && x'`), ['/bin/sh', '-c', 'echo "a b" && x']);
    assert.deepEqual(m.shellSplit(`a\\ b "c\\"d\\e" # comment`), ['a b', 'c"d\\e']);
    assert.deepEqual(m.shellSplit('  '), []);
    assert.deepEqual(m.shellSplit("it''s"), ['its']);
    assert.throws(() => m.shellSplit(`echo 'open`), /unterminated single quote/);
    assert.throws(() => m.shellSplit(`echo "open`), /unterminated double quote/);
    for (const words of [['a b', "it's", '$HOME', ''], ['nginx', '-g', 'daemon off;']]) {
      assert.deepEqual(m.shellSplit(m.shellJoin(words)), words, 'shellJoin is read back as the same words');
    }
  });

  test("Manager's NUL-joined env, and its delete of a bad entry", () => {
    assert.deepEqual(m.parseEnv('A=1\0B=x=y\0C='), { A: '1', B: 'x=y', C: '' });
    assert.equal(m.joinEnv({ B: '2', A: '1' }), 'A=1\0B=2');
    assert.throws(() => m.parseEnv('1A=x'), /not KEY=value/);
    assert.throws(() => m.parseEnv('NOEQUALS'), /not KEY=value/);
  });

  test('the env digest is the bridge’s (length-prefixed SHA-256 in key order)', () => {
    // An empty env hashes nothing: SHA-256 of the empty input.
    assert.equal(m.envDigest({}), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
    assert.notEqual(m.envDigest({ AB: 'C' }), m.envDigest({ A: 'BC' }));
    assert.equal(m.envDigest({ B: '1', A: '2' }), m.envDigest({ A: '2', B: '1' }));
  });

  test('bad containers are refused, naming the field', () => {
    const settings = m.settingsFromEnv({});
    const ok = { namespace: 'n', nodeId: 1, containerId: 2, hostname: 'web', image: 'docker.io/library/nginx:latest' };
    assert.throws(() => m.desired({ ...ok, hostname: 'Web_1' }, settings), /hostname "Web_1"/);
    assert.throws(() => m.desired({ ...ok, image: ' ' }, settings), /image/);
    assert.throws(() => m.desired({ ...ok, cores: 0 }, settings), /cores \(0\)/);
    assert.throws(() => m.desired({ ...ok, services: [{ type: 'transport', internalPort: 22 }] }, settings), /tcp or udp/);
    assert.throws(() => m.desired({ ...ok, services: [{ type: 'http', internalPort: 70000 }] }, settings), /not a port/);
  });

  test('settings from the environment, as the bridge’s flags', () => {
    const s = m.settingsFromEnv({ MW_REQUESTS_PERCENT: '25', MW_ROOTFS_MOUNT_PATH: 'none', MW_SERVICE_TYPE: 'LoadBalancer', MW_SERVICE_ANNOTATIONS: 'a=b,c=d' });
    assert.equal(s.requestsPercent, 25);
    assert.equal(s.rootfs.mountPath, null);
    assert.deepEqual(s.service.annotations, { a: 'b', c: 'd' });
    assert.throws(() => m.settingsFromEnv({ MW_REQUESTS_PERCENT: '0' }), /1 to 100/);
    assert.throws(() => m.settingsFromEnv({ MW_ROOTFS_ON_DELETE: 'keep' }), /retain or delete/);
    // Isolation, as the bridge's --isolation-allow-from: unset is none, `none` allows nothing.
    assert.deepEqual(m.settingsFromEnv({}).isolationAllowFrom, []);
    assert.equal(m.isolation([]), null);
    assert.deepEqual(m.isolation(['none']), {});
    assert.deepEqual(m.settingsFromEnv({ MW_ISOLATION_ALLOW_FROM: 'cidr:10.0.0.0/24, namespace:ingress-nginx' }).isolationAllowFrom, [
      'cidr:10.0.0.0/24',
      'namespace:ingress-nginx',
    ]);
    assert.deepEqual(m.isolation(['cidr:fd00::/64']), { allowFrom: [{ cidr: 'fd00::/64' }] });
    for (const bad of ['10.0.0.0/24', 'cidr:10.0.0.0', 'cidr:10.0.0.0/33', 'namespace:Ingress', 'pods:web', 'none,cidr:1.2.3.4/32']) {
      assert.throws(() => m.settingsFromEnv({ MW_ISOLATION_ALLOW_FROM: bad }), /MW_ISOLATION_ALLOW_FROM: .*cidr:<address>\/<bits>, namespace:<name> or none/, bad);
    }
  });

  test('status words, current generation only', () => {
    const mw = (phase, observed = 2, state = 'Running') => ({ metadata: { generation: 2 }, spec: { state }, status: { phase, observedGeneration: observed } });
    assert.equal(m.managerStatus(null), 'missing');
    assert.equal(m.managerStatus(mw('Running')), 'running');
    assert.equal(m.managerStatus(mw('Creating')), 'creating');
    assert.equal(m.managerStatus(mw('Updating')), 'creating');
    assert.equal(m.managerStatus(mw('Stopped')), 'offline');
    assert.equal(m.managerStatus(mw('Failed')), 'failed');
    assert.equal(m.managerStatus(mw('Running', 1)), 'creating');
    assert.equal(m.managerStatus(mw('Running', 1, 'Stopped')), 'offline');
  });

  test('task ids and rootfs sizes in every form Manager sends', () => {
    assert.deepEqual(m.parseTaskId(m.taskId('update', 'apps', 'web', 3)), { op: 'update', namespace: 'apps', name: 'web', generation: 3 });
    assert.throws(() => m.parseTaskId('UPID:pve:1'), /not a Kubernetes task id/);
    assert.equal(rootfsGb('local-lvm:20'), 20);
    assert.equal(rootfsGb('web-rootfs,size=30G'), 30);
    assert.equal(rootfsGb(8), 8);
    assert.throws(() => rootfsGb('local-lvm'), /no size/);
  });
});
