// Drives `akm mcp` with the official TypeScript SDK client, which validates every structuredContent
// against its tool's outputSchema. Usage: node client.mjs <project dir> <akm command...>
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [cwd, cmd, ...args] = process.argv.slice(2);
const env = {};
for (const k of ["PATH", "HOME", "AKM_DATA_DIR", "XDG_CONFIG_HOME", "SHIV_ROOT", "PYTHONPATH"]) {
  if (process.env[k] !== undefined) env[k] = process.env[k];
}
const client = new Client({ name: "akm-ts-test", version: "0.0.1" });
await client.connect(new StdioClientTransport({ command: cmd, args: [...args, "mcp"], cwd, env }));

const names = (await client.listTools()).tools.map((t) => t.name).sort();
assert.deepEqual(names, ["setup", "unit_report", "workflow_abandon", "workflow_catalog", "workflow_events", "workflow_lint",
  "workflow_list", "workflow_next", "workflow_resume", "workflow_rewind", "workflow_run", "workflow_status",
  "workflow_wait"]);

const run = await client.callTool({ name: "workflow_run", arguments: { target: "flow.md", params: { topics: ["a", "b"] } } });
assert.equal(run.isError, false);
assert.equal(run.structuredContent.run.status, "awaiting_session");
const runId = run.structuredContent.run.runId;

let brief = (await client.callTool({ name: "workflow_next", arguments: { run_id: runId } })).structuredContent;
assert.equal(brief.kind, "units");
for (const u of brief.units) {
  const r = await client.callTool({ name: "unit_report", arguments: { run_id: runId, unit_id: u.unitId,
    status: "completed", result: { line: `about ${u.context.item}` } } });
  assert.equal(r.isError, false);
}
const bad = await client.callTool({ name: "unit_report", arguments: { run_id: runId, unit_id: "nope", status: "completed" } });
assert.equal(bad.isError, true);
assert.equal(JSON.parse(bad.content[1].text).code, "UNKNOWN_UNIT");

brief = (await client.callTool({ name: "workflow_next", arguments: { run_id: runId } })).structuredContent;
assert.equal(brief.kind, "judge");
const verdict = await client.callTool({ name: "unit_report", arguments: { run_id: runId, unit_id: brief.judge.unitId,
  status: "completed", verdict: { complete: true } } });
assert.equal(verdict.structuredContent.stepOutcome.kind, "completed");

const done = await client.callTool({ name: "workflow_run", arguments: { target: runId } });
assert.equal(done.structuredContent.run.status, "completed");
const report = await client.callTool({ name: "workflow_status", arguments: { run_id: runId, format: "html" } });
assert.equal(report.isError, false, JSON.stringify(report.content).slice(0, 500));
const link = report.content.at(-1);  // the report is a resource to read, not inlined
assert.equal(link.type, "resource_link");
assert.equal(link.mimeType, "text/html");
const page = await client.readResource({ uri: link.uri });
assert.equal(page.contents[0].mimeType, "text/html");
assert.ok(page.contents[0].text.startsWith("<!DOCTYPE html>"));
for (const [name, a] of [["workflow_status", { run_id: runId, units: true }], ["workflow_list", {}],
                         ["workflow_lint", { paths: ["flow.md"] }], ["workflow_events", { run_id: runId }],
                         ["workflow_catalog", {}], ["setup", {}], ["workflow_wait", { run_id: runId, timeout: "1s" }]]) {
  const r = await client.callTool({ name, arguments: a });
  assert.equal(r.isError, false, `${name}: ${JSON.stringify(r.content)}`);
}
await client.close();
console.log("ok");
