// `@atomic/plugin` as an atomictoolsd worker resolves it: `tool()` returns its input, and
// `tool.schema` is Zod, the copy the tool module itself would import (its tools dir's own
// node_modules first, else the daemon's support packages), which the worker found before loading
// the module.

const zod = globalThis.__atomictoolsZod

if (zod === undefined) {
  const error = new Error("Cannot find package 'zod' imported from @atomic/plugin")
  error.code = "ERR_MODULE_NOT_FOUND"
  error.specifier = "zod"
  throw error
}

export function tool(input) {
  return input
}

tool.schema = zod.z ?? zod
