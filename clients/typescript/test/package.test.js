// The package as a user imports it, by its name and its subpaths (Node
// resolves a package's own name through its "exports"), with the types
// beside each entry point.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
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
