// How a Node worker resolves what a tool module imports (module.registerHooks, in this thread):
//
// - `@atomic/plugin` is the worker's own (modules/@atomic/plugin), never fetched or installed;
// - any other package resolves as the tool module's own imports do (its tools dir's node_modules,
//   and those above it) and, when none has it, from the daemon's support packages; what the worker
//   itself imports by name (zod) resolves as if the tool module imported it;
// - a relative import without an extension (`./util`, as Bun and TypeScript write them) or with the
//   `.js` of a `.ts` file finds the file, as Bun would.
//
// Each file of the tools dir that loads is reported (`onLoad`), so the daemon reloads the module
// when one of them changes.

import { registerHooks } from "node:module"
import { readFileSync } from "node:fs"
import { join, sep } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

const EXTENSIONS = [".ts", ".mts", ".js", ".mjs", ".cts", ".cjs", "/index.ts", "/index.mts", "/index.js", "/index.mjs"]

export function installNodeHooks({ toolsDir, toolPath, runtimeDir, packages, onLoad }) {
  if (typeof registerHooks !== "function") {
    throw new Error(`this Node.js (${process.version}) has no module.registerHooks: use Node 22.15 or newer, or Bun`)
  }
  const toolURL = pathToFileURL(toolPath).href
  const ownPlugin = pathToFileURL(join(runtimeDir, "modules", "@atomic", "plugin", "index.mjs")).href
  const runtimePrefix = pathToFileURL(runtimeDir).href + "/"
  const toolsPrefix = pathToFileURL(toolsDir).href + "/"
  const supportParent = packages ? pathToFileURL(join(packages, "package.json")).href : null

  const isBare = (specifier) => !/^(\.{1,2}\/|\/|[a-zA-Z][a-zA-Z0-9+.-]*:)/.test(specifier) && !specifier.startsWith("#")

  function resolveRelative(specifier, context, nextResolve, error) {
    const stems = specifier.endsWith(".js") ? [specifier.slice(0, -3), specifier] : [specifier]
    for (const stem of stems) {
      for (const extension of EXTENSIONS) {
        if (stem === specifier && extension === ".js") continue
        try {
          return nextResolve(stem + extension, context)
        } catch {}
      }
    }
    throw error
  }

  registerHooks({
    resolve(specifier, context, nextResolve) {
      if (specifier === "@atomic/plugin") return { url: ownPlugin, shortCircuit: true }
      const bare = isBare(specifier)
      const parentURL = context.parentURL
      const asked = bare && parentURL?.startsWith(runtimePrefix) ? { ...context, parentURL: toolURL } : context
      try {
        return nextResolve(specifier, asked)
      } catch (error) {
        if (error?.code !== "ERR_MODULE_NOT_FOUND") throw error
        if (bare && supportParent !== null) return nextResolve(specifier, { ...context, parentURL: supportParent })
        if (!bare && specifier.startsWith(".") && parentURL?.startsWith(toolsPrefix)) {
          return resolveRelative(specifier, context, nextResolve, error)
        }
        throw error
      }
    },
    load(url, context, nextLoad) {
      const result = nextLoad(url, context)
      if (url.startsWith(toolsPrefix)) {
        const path = fileURLToPath(url)
        const source = result.source
        let bytes = null
        if (source instanceof Uint8Array) bytes = source
        else if (typeof source === "string") bytes = new TextEncoder().encode(source)
        else {
          try {
            bytes = readFileSync(path)
          } catch {}
        }
        if (bytes !== null && path.startsWith(toolsDir + sep)) onLoad(path, bytes)
      }
      return result
    },
  })
}
