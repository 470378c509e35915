// The resolve and load hooks of a Node worker (see node-hooks.mjs), for module.registerHooks (their
// `next` functions answer at once) and module.register (they answer with promises): each step
// awaits only what is a promise.

import { readFileSync } from "node:fs"
import { sep } from "node:path"
import { fileURLToPath } from "node:url"

import { checkContent } from "./content.mjs"
import { checkWriters } from "./writers.mjs"

const EXTENSIONS = [".ts", ".mts", ".js", ".mjs", ".cts", ".cjs", "/index.ts", "/index.mts", "/index.js", "/index.mjs"]
const isBare = (specifier) => !/^(\.{1,2}\/|\/|[a-zA-Z][a-zA-Z0-9+.-]*:)/.test(specifier) && !specifier.startsWith("#")
const isPromise = (value) => value !== null && typeof value?.then === "function"

/** `first()`, or on a "not found" error `then(error)`; whichever of them is a promise, awaited. */
function orElse(first, then) {
  let value
  try {
    value = first()
  } catch (error) {
    return then(error)
  }
  return isPromise(value) ? value.catch(then) : value
}

function candidates(specifier) {
  const stems = specifier.endsWith(".js") ? [specifier.slice(0, -3), specifier] : [specifier]
  return stems.flatMap((stem) => EXTENSIONS.filter((ext) => !(stem === specifier && ext === ".js")).map((ext) => stem + ext))
}

export function hooks(settings, onLoad) {
  const { toolsDir, toolURL, ownPlugin, runtimePrefix, toolsPrefix, supportParent } = settings

  function tryEach(names, context, nextResolve, error) {
    if (!names.length) throw error
    return orElse(() => nextResolve(names[0], context), () => tryEach(names.slice(1), context, nextResolve, error))
  }

  function resolve(specifier, context, nextResolve) {
    if (specifier === "@atomic/plugin") return { url: ownPlugin, shortCircuit: true }
    const bare = isBare(specifier)
    const parentURL = context.parentURL
    const asked = bare && parentURL?.startsWith(runtimePrefix) ? { ...context, parentURL: toolURL } : context
    return orElse(
      () => nextResolve(specifier, asked),
      (error) => {
        if (error?.code !== "ERR_MODULE_NOT_FOUND") throw error
        if (bare && supportParent !== null) return nextResolve(specifier, { ...context, parentURL: supportParent })
        if (!bare && specifier.startsWith(".") && parentURL?.startsWith(toolsPrefix)) {
          return tryEach(candidates(specifier), context, nextResolve, error)
        }
        throw error
      },
    )
  }

  function noted(url, result) {
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
      if (path.startsWith(toolsDir + sep) && !url.includes("/node_modules/")) checkContent(settings.trusted, path, bytes)
      if (bytes !== null && path.startsWith(toolsDir + sep)) onLoad(path, bytes)
    }
    return result
  }

  function load(url, context, nextLoad) {
    if (url.startsWith(toolsPrefix) && !url.includes("/node_modules/")) checkWriters(fileURLToPath(url))
    const result = nextLoad(url, context)
    return isPromise(result) ? result.then((value) => noted(url, value)) : noted(url, result)
  }

  return { resolve, load }
}
