// The package says what the project is: its licence, and a README that lists every setting the
// provider reads.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const path = require('path');

const here = path.join(__dirname, '..');
const read = (...p) => fs.readFileSync(path.join(here, ...p), 'utf8');

test("the licence is the project's (MIT)", () => {
  assert.match(read('..', '..', 'LICENSE'), /^MIT License/);
  assert.equal(JSON.parse(read('package.json')).license, 'MIT');
  assert.equal(JSON.parse(read('package-lock.json')).packages[''].license, 'MIT');
});

test('the README names every MW_* setting the provider reads', () => {
  const readme = read('README.md');
  const code = ['index.js', ...fs.readdirSync(path.join(here, 'lib')).map((f) => path.join('lib', f))].map((f) => read(f)).join('\n');
  const names = [...new Set(code.match(/\bMW_[A-Z_]+[A-Z]\b/g))].sort();
  assert.ok(names.length >= 10, `found ${names}`);
  for (const name of names) assert.ok(readme.includes(`\`${name}\``), `${name} is not in README.md`);
});
