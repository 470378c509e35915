// A JavaScript worker: the code a Bun or Node process runs to load one TypeScript or JavaScript tool
// module and serve calls to its tools, speaking the daemon's worker protocol (protocol.py,
// worker/main.py lists the messages) on descriptor 3.
//
// It is started by worker/jsexec.py, which confined the process (when its project is
// trusted with --sandbox), made descriptors 1 and 2 pipes that a drain process reads (its "output"
// frames come on descriptor 4), cleaned the environment and changed to the module's working
// directory before the exec. Its one argument is a JSON object: the module's path, the limits, the
// spill dir, the runtime's name and where the support packages are.
//
// Each call runs as the tool's promise; its context's `abort` fires when the daemon cancels the call
// (the caller cancelled, or the timeout passed); a tool that goes on regardless is killed with its
// worker after the grace period, as a Python tool is.

import { readFileSync, statSync } from "node:fs"
import { dirname, join, sep } from "node:path"
import { pathToFileURL, fileURLToPath } from "node:url"
import { crc32 } from "./crc32.mjs"

import { openChannel, relayOutput } from "./channel.mjs"
import { encodeFrame, float64 } from "./msgpack.mjs"
import { errorResult, exceptionText, makeResult } from "./results.mjs"
import { ToolProblem, collectTools, definition, splitUndeclared } from "./tools.mjs"
import { checkContent } from "./content.mjs"
import { checkWriters } from "./writers.mjs"

const spec = JSON.parse(process.argv[process.argv.length - 1])
const RUNTIME_DIR = dirname(fileURLToPath(import.meta.url))
const TOOLS_DIR = dirname(spec.path)
const SUPPORT = new Set(["zod", "@opencode-ai/plugin", "@github/copilot-sdk", "@atomic/plugin"])
const encoder = new TextEncoder()
const decoder = new TextDecoder()

try {
  process.title = "atomictoolsd-wk"
} catch {}

const calls = new Map() // call id → {controller, asks, cancelled}
const asks = new Map() // ask id → {call, resolve, reject}
let nextAsk = 1
let tools = new Map()

const channel = await openChannel(3, (message) => dispatch(message))
await relayOutput(4, channel)
// What a tool leaves failing in the background (a timer that throws, a promise nobody awaits) is
// logged as its output, as a Python thread's exception is: it ends neither the worker nor its calls.
process.on("uncaughtException", (error) => console.error("Uncaught exception in a tool:", error))
process.on("unhandledRejection", (reason) => console.error("Unhandled promise rejection in a tool:", reason))

// -- loading ------------------------------------------------------------------------------------

// What a load report may hold (protocol.py's MAX_REPORTED_FILES and MAX_LOAD_REPORT): the daemon
// refuses more.
const MAX_REPORTED_FILES = 4096
const MAX_LOAD_REPORT = 4 << 20
const MAX_DROPPED_KEYS = 64 // undeclared arguments one report names (protocol.py)
const loaded = new Map() // path of a file of the tools dir → [size, mtime_ns, crc32] as it was loaded

function noteLoaded(path, bytes) {
  if (!path.startsWith(TOOLS_DIR + sep) || path === spec.path) return
  try {
    const info = statSync(path, { bigint: true })
    loaded.set(path, [Number(info.size), info.mtimeNs, crc32(bytes)]) // the mtime whole (a BigInt): the daemon compares it to the ns
  } catch {}
}

const isBare = (specifier) => !/^(\.{1,2}\/|\/|[a-zA-Z][a-zA-Z0-9+.-]*:)/.test(specifier) && !specifier.startsWith("#")
const OWN_PLUGIN = join(RUNTIME_DIR, "modules", "@atomic", "plugin", "index.mjs")

/** Where Bun must find what a file of the tools dir imports as `specifier`, when its own resolution
 * (the file's node_modules, then those above it) would not: `@atomic/plugin` is the worker's, and a
 * package none of them has comes from the support packages. Null: as Bun resolves it. */
function bunRedirect(specifier, directory) {
  if (specifier === "@atomic/plugin") return OWN_PLUGIN
  if (!isBare(specifier) || !spec.packages) return null
  try {
    Bun.resolveSync(specifier, directory)
    return null
  } catch {}
  try {
    return Bun.resolveSync(specifier, spec.packages)
  } catch {
    return null
  }
}

const transpilers = new Map()

// Bun's runtime plugins cannot resolve a bare specifier (their onResolve does not run for one), and
// its NODE_PATH ignores a package that only exports for `import` (@opencode-ai/plugin): so the file
// itself names where such an import is, its string literal replaced (on the same line: its errors'
// lines stay true).
function redirectImports(text, loader, directory) {
  let imports
  try {
    let transpiler = transpilers.get(loader)
    if (transpiler === undefined) transpilers.set(loader, (transpiler = new Bun.Transpiler({ loader })))
    imports = transpiler.scanImports(text)
  } catch {
    return text // Bun reports what is wrong with it as it loads it
  }
  for (const specifier of new Set(imports.map((entry) => entry.path))) {
    const target = bunRedirect(specifier, directory)
    if (target === null) continue
    for (const quote of ['"', "'", "`"]) text = text.replaceAll(`${quote}${specifier}${quote}`, JSON.stringify(target))
  }
  return text
}

async function installHooks() {
  if (typeof Bun !== "undefined") {
    const { plugin } = await import("bun")
    const escaped = (TOOLS_DIR + sep).replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")
    const loaders = { ts: "ts", mts: "ts", cts: "ts", tsx: "tsx", js: "js", mjs: "js", cjs: "js", jsx: "jsx" }
    plugin({
      name: "atomictoolsd",
      setup(build) {
        // Bun reads the files of the tools dir through this hook, so what was loaded is known to the byte.
        build.onLoad({ filter: new RegExp(`^${escaped}(?!.*/node_modules/)`) }, (args) => {
          checkWriters(args.path)
          const bytes = readFileSync(args.path)
          checkContent(spec.trusted, args.path, bytes)
          noteLoaded(args.path, bytes)
          const extension = args.path.slice(args.path.lastIndexOf(".") + 1)
          const loader = loaders[extension] ?? "ts"
          return { contents: redirectImports(decoder.decode(bytes), loader, dirname(args.path)), loader }
        })
      },
    })
    return
  }
  const { installNodeHooks } = await import("./node-hooks.mjs")
  flushLoaded = await installNodeHooks({
    toolsDir: TOOLS_DIR, toolPath: spec.path, runtimeDir: RUNTIME_DIR, packages: spec.packages, trusted: spec.trusted,
    onLoad: noteLoaded,
  })
}

let flushLoaded = async () => {} // until what the hooks reported of the files loaded is in (Node before 22.15)

/** `specifier` resolved as the tool module would resolve it, else from the support packages. */
function resolveForTool(specifier) {
  if (typeof Bun !== "undefined") {
    for (const base of [TOOLS_DIR, spec.packages].filter(Boolean)) {
      try {
        return Bun.resolveSync(specifier, base)
      } catch {}
    }
    return null
  }
  try {
    return import.meta.resolve(specifier) // the hooks resolve it from the tool's directory
  } catch {
    return null
  }
}

function pluginInput() {
  const directory = spec.cwd || TOOLS_DIR
  return {
    directory,
    worktree: directory,
    project: { id: directory, worktree: directory },
    client: undefined,
    serverUrl: undefined,
    $: typeof Bun !== "undefined" ? Bun.$ : undefined,
  }
}

/** ``text`` cut to about ``most`` characters, its start and end kept: an error's message can be
 * megabytes, and a load report has 4 MiB in all (as the Python runtime's ``_clipped``). */
function clipped(text, most) {
  if (text.length <= most) return text
  const half = Math.floor(most / 2)
  return `${text.slice(0, half)}\n… ${(text.length - most).toLocaleString("en-US")} characters left out …\n${text.slice(-half)}`
}

/** Where in the module file an error happened (its line), and the text the daemon shows. */
function failureOf(error, source) {
  const info = { file: spec.path, line: null, message: "", traceback: "" }
  if (error instanceof ToolProblem) {
    info.message = error.message
    return info
  }
  const name = error?.name ?? "Error"
  info.message = `${name}: ${error?.message ?? String(error)}`
  info.traceback = String(error?.stack ?? "")
  if (error?.position?.file === spec.path && typeof error.position.line === "number") info.line = error.position.line
  const stack = String(error?.stack ?? "")
  const escaped = spec.path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")
  const frame = stack.match(new RegExp(`(?:file://)?${escaped}:(\\d+)`))
  if (info.line === null && frame) info.line = Number(frame[1])
  const missing = error?.code === "ERR_MODULE_NOT_FOUND" || name === "ResolveMessage"
  if (missing) {
    const specifier = error?.specifier ?? /Cannot find (?:package|module) '([^']+)'/.exec(error?.message ?? "")?.[1]
    if (specifier && source !== null) {
      const lines = source.split("\n")
      const at = lines.findIndex((line) => line.includes(`"${specifier}"`) || line.includes(`'${specifier}'`))
      if (at !== -1 && info.line === null) info.line = at + 1
    }
    const root = specifier?.startsWith("@") ? specifier.split("/").slice(0, 2).join("/") : specifier?.split("/")[0]
    if (root && SUPPORT.has(root)) {
      info.message += `; ${root} is one of the packages the daemon provides to tools that do not install them, and they are not installed yet: the daemon installs them on first need (\`atomictoolsd status\` shows how that went), \`atomictoolsd js install\` installs them by hand`
    } else if (root) {
      info.message += `; install it where the module can find it, e.g. cd ${TOOLS_DIR} && npm install ${root}`
    }
    info.outside = true // the module's environment, not its code: tried again on the next scan
  }
  return info
}

async function load() {
  const started = performance.now()
  let source = null
  let fingerprint = null
  try {
    const bytes = readFileSync(spec.path)
    source = decoder.decode(bytes)
    fingerprint = [bytes.length, crc32(bytes)]
    await installHooks()
    const zodPath = resolveForTool("zod")
    if (zodPath !== null) globalThis.__atomictoolsZod = await import(zodPath.startsWith("file:") ? zodPath : pathToFileURL(zodPath).href)
    const exports = await import(pathToFileURL(spec.path).href)
    const zod = globalThis.__atomictoolsZod
    if (zod === undefined) {
      const error = new Error("Cannot find package 'zod'")
      error.code = "ERR_MODULE_NOT_FOUND"
      error.specifier = "zod"
      throw error
    }
    const collected = await collectTools(exports, spec.path, zod, pluginInput())
    tools = collected.tools
    await flushLoaded()
    const runtime = `${spec.runtime} ${spec.version}`
    const report = encodeFrame([
      "loaded",
      [...tools.values()].map((tool) => definition(tool, runtime)),
      float64(performance.now() - started),
      collected.problems,
      deps(),
      fingerprint,
      helpers(),
    ])
    if (report.length - 4 > MAX_LOAD_REPORT) {
      const size = ((report.length - 4) / (1 << 20)).toFixed(1)
      throw new ToolProblem(
        `the module's load report (the definitions of its ${tools.size} tool(s), the files it imported) takes ${size} MiB, more than the ${MAX_LOAD_REPORT >> 20} MiB one may take: split the module, or shorten its schemas and descriptions`,
      )
    }
    channel.sendFrame(report)
    // What loading left behind (the module graph's source, the compiler's garbage) is collected
    // now, while the worker is idle: its resident memory is what the limit and the monitor watch.
    setTimeout(() => (typeof Bun !== "undefined" ? Bun.gc(true) : globalThis.gc?.()), 0)
  } catch (error) {
    await flushLoaded()
    const failure = failureOf(error, source)
    failure.message = clipped(failure.message, 16384)
    failure.traceback = clipped(failure.traceback, 65536)
    channel.send(["failed", { ...failure, deps: deps(), fingerprint, helpers: helpers() }])
    await channel.flush()
    process.exit(0)
  }
}

const reported = () => [...loaded].slice(0, MAX_REPORTED_FILES)
const deps = () => reported().map(([path, [size, mtime]]) => [path, size, mtime])
const helpers = () => reported().map(([path, [size, , crc]]) => [path, size, crc])

// -- calls --------------------------------------------------------------------------------------

// Who asked for the call being read: the daemon sends it when it differs from the call before's.
let context = ["", "", "", "", "", ""]

function dispatch(message) {
  switch (message[0]) {
    case "call":
      if (message[4] !== null) context = message[4] // null: the same as the call before
      startCall(message[1], message[2], message[3], context, message[5])
      break
    case "cancel": {
      const call = calls.get(message[1])
      if (call !== undefined && !call.cancelled) {
        call.cancelled = true
        call.controller.abort(new Error("the call was cancelled"))
        for (const [id, ask] of asks) if (ask.call === message[1]) dropAsk(id, "the call was cancelled (or timed out) while it waited for the client")
      }
      break
    }
    case "answer": {
      const ask = asks.get(message[2])
      if (ask === undefined || ask.call !== message[1]) break
      asks.delete(message[2])
      if (message[3] !== null) ask.resolve(JSON.parse(decoder.decode(message[3])))
      else ask.reject(new Error(message[4] ?? "the client gave no answer"))
      break
    }
    default:
      break
  }
}

function dropAsk(id, why) {
  const ask = asks.get(id)
  asks.delete(id)
  ask?.reject(new Error(why))
}

function answer(callId, result) {
  const call = calls.get(callId)
  calls.delete(callId)
  for (const [id, ask] of asks) if (ask.call === callId) dropAsk(id, "the call has ended")
  channel.send(["result", callId, call?.cancelled ? null : result])
}

async function startCall(callId, name, argumentsJson, context, progress) {
  const tool = tools.get(name)
  if (tool === undefined) {
    channel.send(["result", callId, errorResult(`Unknown tool '${name}' in this module`)])
    return
  }
  const controller = new AbortController()
  const call = { controller, cancelled: false }
  calls.set(callId, call)
  let values
  try {
    values = argumentsJson.length ? JSON.parse(decoder.decode(argumentsJson)) : {}
  } catch (error) {
    answer(callId, errorResult(`Invalid arguments for tool '${name}': ${error.message}`))
    return
  }
  if (values === null || typeof values !== "object" || Array.isArray(values)) {
    answer(callId, errorResult(`Invalid arguments for tool '${name}': Expected \`object\` - at \`$\``))
    return
  }
  if (tool.declared !== null) {
    const split = splitUndeclared(values, tool.declared)
    if (split.error !== undefined) {
      answer(callId, errorResult(`Invalid arguments for tool '${name}': ${split.error}`))
      return
    }
    if (split.dropped.length) channel.send(["dropped", callId, split.dropped.slice(0, MAX_DROPPED_KEYS)])
    values = split.kept
  }
  let result
  try {
    // Awaited only when a promise: a sync schema and a sync tool answer without a microtask between.
    let parsed = tool.parse(values)
    if (parsed instanceof Promise) parsed = await parsed
    if (!parsed.ok) {
      answer(callId, errorResult(`Invalid arguments for tool '${name}': ${parsed.message}`))
      return
    }
    const [sessionId, messageId, agent, directory, worktree, toolUseId] = context
    let value = tool.run(
      parsed.value,
      tool.kind === "copilot"
        ? { sessionId, toolCallId: toolUseId, toolName: name, arguments: values, signal: controller.signal }
        : toolContext(callId, progress, { sessionId, messageId, agent, directory, worktree, toolUseId }, controller.signal),
    )
    if (value !== null && typeof value?.then === "function") value = await value
    result = makeResult(name, value, spec.limits)
  } catch (error) {
    result = errorResult(exceptionText(name, error, RUNTIME_DIR))
  }
  answer(callId, result)
}

function toolContext(callId, progress, who, signal) {
  let step = 0
  return {
    sessionID: who.sessionId,
    messageID: who.messageId,
    agent: who.agent,
    directory: who.directory,
    worktree: who.worktree || who.directory,
    callID: who.toolUseId,
    abort: signal,
    // OpenCode shows this beside the running tool; here it goes to the client as a log message, and
    // as progress when the caller asked for it.
    metadata(input) {
      if (!calls.has(callId)) return
      const title = typeof input?.title === "string" ? input.title : null
      channel.send(["log", callId, "info", encoder.encode(JSON.stringify(input ?? {}))])
      if (progress) channel.send(["progress", callId, float64(++step), null, title])
    },
    // OpenCode's permission request: asked of the client as an elicitation; anything but an
    // accepted "allow" rejects, as a denied permission does in OpenCode.
    ask(input) {
      const permission = String(input?.permission ?? "this action")
      const patterns = Array.isArray(input?.patterns) ? input.patterns.map(String) : []
      const message = `The tool asks permission: ${permission}${patterns.length ? ` (${patterns.join(", ")})` : ""}. Allow it?`
      return elicit(callId, {
        message,
        requestedSchema: {
          type: "object",
          properties: { allow: { type: "boolean", title: "Allow", description: `Allow ${permission}` } },
          required: ["allow"],
        },
      }).then((reply) => {
        if (reply?.action !== "accept" || reply?.content?.allow !== true) throw new Error(`permission denied: ${permission}`)
      })
    },
  }
}

function elicit(callId, params) {
  if (!calls.has(callId)) return Promise.reject(new Error("the call has ended; nothing was asked"))
  const id = nextAsk++
  return new Promise((resolve, reject) => {
    asks.set(id, { call: callId, resolve, reject })
    channel.send(["ask", callId, id, "elicitation/create", encoder.encode(JSON.stringify(params)), null])
  })
}

await load()
