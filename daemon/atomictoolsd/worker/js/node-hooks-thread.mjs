// The hooks of a Node worker before Node 22.15 (module.register): they run in Node's hooks thread and
// report each file of the tools dir that loads over the port node-hooks.mjs gave them.

import { hooks } from "./node-resolve.mjs"

let active = null

export function initialize({ settings, port }) {
  active = hooks(settings, (path, bytes) => port.postMessage({ path, bytes }))
  port.on("message", (message) => {
    if (message.flush) port.postMessage({ flushed: true })
  })
  port.unref()
}

export async function resolve(specifier, context, nextResolve) {
  return active.resolve(specifier, context, nextResolve)
}

export async function load(url, context, nextLoad) {
  return active.load(url, context, nextLoad)
}
