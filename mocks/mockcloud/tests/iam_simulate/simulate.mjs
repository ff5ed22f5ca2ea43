// Evaluates a table of IAM requests with @cloud-copilot/iam-simulate, an independent IAM simulator,
// for mocks/tests/iam_crosscheck.rs. stdin: {"policy": {...}, "account": "...", "principal": "...",
// "requests": [{"action", "resource", "context": {key: [values]}}]}; stdout: one line of JSON,
// [{"decision": "Allowed" | "ExplicitlyDenied" | "ImplicitlyDenied" | "error", "detail"?}].
import { runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const c of process.stdin) chunks.push(c)
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'))

const out = []
for (const r of input.requests) {
  const contextVariables = {}
  for (const [k, v] of Object.entries(r.context)) {
    contextVariables[k] = v.length === 1 && !k.toLowerCase().startsWith('aws:tagkeys') ? v[0] : v
  }
  const simulation = {
    identityPolicies: [{ name: 'node', policy: input.policy }],
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    request: {
      action: r.action,
      principal: input.principal,
      resource: { accountId: input.account, resource: r.resource },
      contextVariables
    }
  }
  const response = await runSimulation(simulation, {})
  if (response.resultType === 'error') {
    out.push({ decision: 'error', detail: response.errors })
  } else {
    out.push({ decision: response.overallResult })
  }
}
process.stdout.write(JSON.stringify(out) + '\n')
