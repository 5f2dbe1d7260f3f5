// The package as a user imports it, by its name and its subpaths (Node
// resolves a package's own name through its "exports"), with the types
// beside each entry point.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import * as client from "@toolq/client";
import * as key from "@toolq/client/key";
import * as stream from "@toolq/client/stream";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

test("the package's entry points resolve by name", () => {
  assert.equal(typeof client.Client, "function");
  assert.equal(typeof client.callKey, "function");
  assert.equal(typeof key.callKey, "function");
  assert.equal(typeof stream.streamTurn, "function");
  // One module, whichever way it is reached.
  assert.equal(client.callKey, key.callKey);
  assert.equal(client.streamTurn, stream.streamTurn);
});

test("every export has its types", () => {
  const pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8"));
  for (const [name, entry] of Object.entries(pkg.exports)) {
    for (const file of [entry.import, entry.types]) {
      assert.ok(existsSync(path.join(root, file)), `${name}: ${file} is missing (npm run build)`);
    }
  }
});

test("npm pack ships the built code, its types, the README and the licence, and nothing else", () => {
  const [packed] = JSON.parse(execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { cwd: root, encoding: "utf8" }));
  const files = packed.files.map((f) => f.path);
  for (const want of ["LICENSE", "README.md", "package.json", "dist/index.js", "dist/index.d.ts", "dist/client.d.ts", "dist/key.d.ts", "dist/stream.d.ts"]) {
    assert.ok(files.includes(want), `${want} is not in the package: ${files}`);
  }
  assert.deepEqual(files.filter((f) => !(f.startsWith("dist/") || ["LICENSE", "README.md", "package.json"].includes(f))), []);
  const pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8"));
  assert.equal(pkg.license, "Apache-2.0");
  assert.equal(pkg.publishConfig?.access, "public");
  assert.ok(pkg.repository?.url, "no repository");
  assert.equal(pkg.scripts.prepack, "npm run build");
  // The transport is the user's: the client needs only nats-core and jetstream.
  assert.deepEqual(Object.keys(pkg.dependencies).sort(), ["@nats-io/jetstream", "@nats-io/nats-core"]);
});

test("engines is true to what the dependencies need and to the Node that runs these tests", () => {
  const pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8"));
  const least = Number(/^>=(\d+)$/.exec(pkg.engines.node)?.[1]);
  assert.ok(least > 0, `engines.node ${pkg.engines.node}: want >=N`);
  assert.ok(Number(process.versions.node.split(".")[0]) >= least, `Node ${process.versions.node} runs the tests, engines says ${pkg.engines.node}`);
  // Every runtime dependency, direct or not, accepts Node least.
  const seen = new Set();
  const visit = (name) => {
    if (seen.has(name)) return;
    seen.add(name);
    const dep = JSON.parse(readFileSync(path.join(root, "node_modules", name, "package.json"), "utf8"));
    const need = /(\d+)/.exec(dep.engines?.node ?? "")?.[1];
    assert.ok(need === undefined || Number(need) <= least, `${name}@${dep.version} needs Node ${dep.engines?.node}, engines says ${pkg.engines.node}`);
    Object.keys(dep.dependencies ?? {}).forEach(visit);
  };
  Object.keys(pkg.dependencies).forEach(visit);
});
