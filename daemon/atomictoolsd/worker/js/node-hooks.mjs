// How a Node worker resolves what a tool module imports:
//
// - `@atomic/plugin` is the worker's own (modules/@atomic/plugin), never fetched or installed;
// - any other package resolves as the tool module's own imports do (its tools dir's node_modules,
//   and those above it) and, when none has it, from the daemon's support packages; what the worker
//   itself imports by name (zod) resolves as if the tool module imported it;
// - a relative import without an extension (`./util`, as Bun and TypeScript write them) or with the
//   `.js` of a `.ts` file finds the file, as Bun would.
//
// Each file of the tools dir that loads is reported (`onLoad`), so the daemon reloads the module
// when one of them changes. Node 22.15 and later run these hooks in this thread
// (module.registerHooks); before, Node runs them in a thread of its own (module.register, with
// node-hooks-thread.mjs), which reports the files it loaded over a message port.

import * as nodeModule from "node:module"
import { MessageChannel } from "node:worker_threads"
import { join } from "node:path"
import { pathToFileURL } from "node:url"

import { hooks } from "./node-resolve.mjs"

export async function installNodeHooks({ toolsDir, toolPath, runtimeDir, packages, trusted, onLoad }) {
  const settings = {
    toolsDir,
    trusted: trusted ?? null,
    toolURL: pathToFileURL(toolPath).href,
    ownPlugin: pathToFileURL(join(runtimeDir, "modules", "@atomic", "plugin", "index.mjs")).href,
    runtimePrefix: pathToFileURL(runtimeDir).href + "/",
    toolsPrefix: pathToFileURL(toolsDir).href + "/",
    supportParent: packages ? pathToFileURL(join(packages, "package.json")).href : null,
  }
  // ATOMICTOOLS_NODE_HOOKS=thread: the hooks of Node before 22.15 on a newer one (the tests of both).
  if (typeof nodeModule.registerHooks === "function" && process.env.ATOMICTOOLS_NODE_HOOKS !== "thread") {
    nodeModule.registerHooks(hooks(settings, onLoad))
    return async () => {}
  }
  const { port1, port2 } = new MessageChannel()
  port1.on("message", (message) => {
    if (message.path !== undefined) onLoad(message.path, message.bytes)
  })
  port1.unref()
  nodeModule.register(pathToFileURL(join(runtimeDir, "node-hooks-thread.mjs")).href, {
    parentURL: import.meta.url,
    data: { settings, port: port2 },
    transferList: [port2],
  })
  // What the hooks' thread reported comes before its answer to this, on the same port.
  return () =>
    new Promise((resolve) => {
      port1.ref()
      port1.on("message", function done(message) {
        if (message.flushed) {
          port1.off("message", done)
          port1.unref()
          resolve()
        }
      })
      port1.postMessage({ flush: true })
    })
}


