// In a fully trusted project whose content is followed (docs/trust.md), a worker loads from its tools
// dir only the bytes whose SHA-256 the daemon judged trusted (worker/sourceload.py's rule, for
// a JavaScript worker): a file that arrived through git and awaits review, or that changed while the
// worker started, is refused. `trusted` maps an absolute path to its digest; null: nothing is followed.

let hashBytes = null

function sha256(bytes) {
  if (hashBytes === null) {
    if (typeof Bun !== "undefined") {
      hashBytes = (data) => new Bun.CryptoHasher("sha256").update(data).digest("hex")
    } else {
      const { createHash } = process.getBuiltinModule("node:crypto") // synchronous: the hooks may be
      hashBytes = (data) => createHash("sha256").update(data).digest("hex")
    }
  }
  return hashBytes(bytes)
}

export function checkContent(trusted, path, bytes) {
  if (trusted === null || trusted === undefined) return
  if (bytes === null || trusted[path] !== sha256(bytes)) {
    throw new Error(
      `refused to load ${path}: its content is not what you trusted (it arrived through git and awaits ` +
        "your review, or it changed while the worker started)",
    )
  }
}
