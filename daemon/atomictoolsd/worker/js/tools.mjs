// The tools of one module: what its exports define, under the names Atomic, OpenCode and the
// Copilot SDK give them, with their input schemas and the validation of their arguments.
//
// - `tool({description, args, execute})` (`@atomic/plugin`, `@opencode-ai/plugin`): the default
//   export is named after the file (`lint.ts` → `lint`), a named export `<file>_<export>`
//   (`weather.ts` exporting `getTemp` → `weather_getTemp`).
// - An OpenCode plugin, an exported function returning `{ tool: { name: tool({...}) } }`: each tool
//   by its key. It is called once, when the module loads, with the plugin input.
// - `defineTool(name, {description, parameters, handler})` (`@github/copilot-sdk`), exported alone
//   or in an array: by its own name. `parameters` is a Zod schema or a JSON Schema object.
//
// A schema is Zod's own JSON Schema (`z.toJSONSchema`, as a tool's input: a field with a default is
// not required) with `additionalProperties: false` at the top; the daemon then makes it portable as
// it does a Python tool's. Arguments are validated by the tool's own schema before it runs.

import { basename, extname } from "node:path"

export class ToolProblem extends Error {}

const isZod = (value) => value !== null && typeof value === "object" && "_zod" in value
const isToolDef = (value) =>
  value !== null && typeof value === "object" && typeof value.execute === "function" && ("args" in value || "description" in value)
const isCopilotTool = (value) =>
  value !== null && typeof value === "object" && typeof value.name === "string" && typeof value.handler === "function"

// Zod keeps a schema's description and metadata in its registry, and each copy of the zod package
// has its own (OpenCode's plugin package pins one): read them from the schema itself, which knows
// its own registry, whichever copy made it.
const ownMetadata = { get: (schema) => (typeof schema?.meta === "function" ? schema.meta() : undefined) }

/** Every tool `exports` (a module namespace) defines, and the problems of the ones left out. */
export async function collectTools(exports, path, zod, pluginInput) {
  const stem = basename(path, extname(path))
  const found = [] // [name, definition, kind]
  for (const [key, value] of Object.entries(exports)) {
    if (isToolDef(value)) found.push([key === "default" ? stem : `${stem}_${key}`, value, "tool"])
    else if (isCopilotTool(value)) found.push([value.name, value, "copilot"])
    else if (Array.isArray(value) && value.length && value.every(isCopilotTool)) {
      for (const item of value) found.push([item.name, item, "copilot"])
    } else if (typeof value === "function") {
      const hooks = await value(pluginInput)
      const tools = hooks !== null && typeof hooks === "object" ? hooks.tool : undefined
      if (tools !== null && typeof tools === "object") {
        for (const [name, definition] of Object.entries(tools)) {
          if (isToolDef(definition)) found.push([name, definition, "tool"])
        }
      }
    }
  }
  if (!found.length) {
    throw new ToolProblem(
      "the module defines no tool: export one, e.g. `export default tool({ description, args, execute })` " +
        'with `import { tool } from "@atomic/plugin"`, or `defineTool(name, {...})` from "@github/copilot-sdk"',
    )
  }
  const tools = new Map()
  const problems = []
  for (const [name, definition, kind] of found) {
    if (tools.has(name)) {
      problems.push({ tool: name, line: null, message: "another export of this module already has this name; this one is skipped" })
      continue
    }
    try {
      tools.set(name, kind === "tool" ? openCodeTool(name, definition, zod) : copilotTool(name, definition, zod))
    } catch (error) {
      problems.push({ tool: name, line: null, message: String(error?.message ?? error) })
    }
  }
  if (!tools.size && problems.length) throw new ToolProblem(problems.map((p) => `${p.tool}: ${p.message}`).join("; "))
  return { tools, problems }
}

function openCodeTool(name, definition, zod) {
  const args = definition.args ?? {}
  let object
  if (isZod(args)) {
    object = args
  } else {
    if (typeof args !== "object") throw new ToolProblem("args must be an object of Zod schemas (tool.schema.string(), …)")
    for (const [key, field] of Object.entries(args)) {
      if (!isZod(field)) throw new ToolProblem(`args.${key} is not a Zod schema (write it with tool.schema, e.g. tool.schema.string())`)
    }
    object = zod.object(args)
  }
  return {
    name,
    kind: "tool",
    description: typeof definition.description === "string" ? definition.description : "",
    ...zodInput(object, zod),
    run: (values, context) => definition.execute(values, context),
  }
}

function copilotTool(name, definition, zod) {
  const parameters = definition.parameters
  let input
  if (parameters === undefined || parameters === null) {
    const inputSchema = { type: "object", properties: {}, additionalProperties: false }
    input = { inputSchema, declared: new Set(), parse: (values) => ({ ok: true, value: values }) }
  } else if (isZod(parameters)) {
    input = zodInput(parameters, zod)
  } else if (typeof parameters === "object") {
    input = jsonInput(parameters, zod)
  } else {
    throw new ToolProblem("parameters must be a Zod schema or a JSON Schema object")
  }
  return {
    name,
    kind: "copilot",
    description: typeof definition.description === "string" ? definition.description : "",
    ...input,
    run: (values, context) => definition.handler(values, context),
  }
}

function zodInput(schema, zod) {
  let inputSchema
  try {
    inputSchema = zod.toJSONSchema(schema, { io: "input", unrepresentable: "any", metadata: ownMetadata })
  } catch (error) {
    throw new ToolProblem(`its schema cannot be written as JSON Schema: ${error?.message ?? error}`)
  }
  delete inputSchema.$schema
  if (inputSchema.type !== "object") throw new ToolProblem("its parameters must be an object schema (z.object({...}))")
  const declared = declaredKeys(inputSchema)
  if (!("additionalProperties" in inputSchema)) inputSchema.additionalProperties = false
  return { inputSchema, declared, parse: (values) => parseWith(schema, values) }
}

const parsed = (outcome) =>
  outcome.success ? { ok: true, value: outcome.data } : { ok: false, message: describeIssues(outcome.error.issues) }

/** Check `values` with a Zod schema: synchronously (no promise on the call path) unless the schema
 * has an async refinement or transform, which Zod refuses to run so (then a promise of it). */
function parseWith(schema, values) {
  try {
    return parsed(schema.safeParse(values))
  } catch (error) {
    if (!/async/i.test(`${error?.constructor?.name} ${error?.message}`)) throw error
    return schema.safeParseAsync(values).then(parsed)
  }
}

function jsonInput(parameters, zod) {
  const inputSchema = structuredClone(parameters)
  delete inputSchema.$schema
  if (inputSchema.type !== "object") throw new ToolProblem('parameters must be a JSON Schema with "type": "object"')
  let schema = null
  if (typeof zod.fromJSONSchema === "function") {
    try {
      schema = zod.fromJSONSchema(inputSchema)
    } catch (error) {
      throw new ToolProblem(`its JSON Schema cannot be used to check arguments: ${error?.message ?? error}`)
    }
  }
  return {
    inputSchema,
    declared: declaredKeys(inputSchema),
    parse: (values) => (schema === null ? { ok: true, value: values } : parseWith(schema, values)),
  }
}

// The properties an object schema declares, when it takes no others (else null: every key is its own).
function declaredKeys(schema) {
  if ("additionalProperties" in schema && schema.additionalProperties !== false) return null
  if (schema.patternProperties !== undefined) return null
  return new Set(Object.keys(schema.properties ?? {}))
}

/** Zod's issues as the daemon words a bad argument: what is wrong, and where (`$.config.port`). */
export function describeIssues(issues) {
  return issues
    .map((issue) => {
      const where = (issue.path ?? []).map((step) => (typeof step === "number" ? `[${step}]` : `.${String(step)}`)).join("")
      return `${issue.message} - at \`$${where}\``
    })
    .join("; ")
}

/** The MCP tool object the daemon lists. */
export function definition(tool, runtime) {
  const out = { name: tool.name }
  if (tool.description) out.description = tool.description
  out.inputSchema = tool.inputSchema
  out["atomic/runtime"] = runtime
  return out
}

// Arguments a tool does not declare: a near miss of a declared one is an error naming it, any
// other is dropped (and reported); the rule of worker/arguments.py.

const fold = (name) => name.toLowerCase().replaceAll("-", "").replaceAll("_", "")

function distance(a, b, limit) {
  if (Math.abs(a.length - b.length) > limit) return limit + 1
  let previous2 = []
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const current = [i, ...new Array(b.length).fill(0)]
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      current[j] = Math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) current[j] = Math.min(current[j], previous2[j - 2] + 1)
    }
    if (Math.min(...current) > limit) return limit + 1
    previous2 = previous
    previous = current
  }
  return previous[b.length]
}

function misspellingOf(key, declared) {
  const folded = fold(key)
  let best = null
  for (const name of declared) {
    const target = fold(name)
    const limit = target.length <= 4 ? 1 : 2
    const d = folded === target ? 0 : distance(folded, target, limit)
    if (d <= limit && (best === null || d < best[0])) best = [d, name]
  }
  return best === null ? null : best[1]
}

/** `{kept, dropped}`, or `{error}` when an undeclared key is a near miss of a declared one. */
export function splitUndeclared(values, declared) {
  const unknown = Object.keys(values).filter((key) => !declared.has(key))
  if (!unknown.length) return { kept: values, dropped: [] }
  for (const key of unknown) {
    const meant = misspellingOf(key, declared)
    if (meant !== null) return { error: `unknown argument '${key}'; did you mean '${meant}'?` }
  }
  const kept = {}
  for (const [key, value] of Object.entries(values)) if (declared.has(key)) kept[key] = value
  return { kept, dropped: unknown }
}
