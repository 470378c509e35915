// What a tool returned, as the JSON of an MCP CallToolResult, by the rules a Python worker follows
// (worker/results.py and truncate.py):
//
// - a string: one text block; an OpenCode result object ({output, title, metadata}): its output;
// - a Copilot SDK result object ({textResultForLlm, resultType, binaryResultsForLlm}): its text, its
//   images, and isError for any result type but "success";
// - any other value: its JSON as text, and a plain object also as structuredContent;
// - a text past truncate_lines lines or truncate_bytes bytes keeps its head and a notice, and the
//   whole is written to a spill file (`_meta["atomic/fullOutput"]`);
// - a result larger than max_result_bytes is refused, kept whole in a spill file.

import { closeSync, mkdirSync, openSync, writeSync } from "node:fs"
import { join } from "node:path"

const encoder = new TextEncoder()
const TEXT_HEAD = '{"content":[{"type":"text","text":'
const TEXT_TAIL = "}]}"
const COPILOT_ERRORS = new Set(["failure", "rejected", "denied", "timeout"])

export function errorResult(text) {
  return encoder.encode(`${TEXT_HEAD}${JSON.stringify(text)}}],"isError":true}`)
}

const grouped = (n) => n.toLocaleString("en-US")

/** The truncated form of `text` and its spill file, or null when it is within both limits. */
export function truncate(text, maxLines, maxBytes, spillDir, label) {
  let newlines = 0
  for (let at = text.indexOf("\n"); at !== -1; at = text.indexOf("\n", at + 1)) newlines++
  if (newlines < maxLines && text.length <= maxBytes / 4) return null
  const encoded = encoder.encode(text)
  const linesTotal = newlines + (text.endsWith("\n") ? 0 : 1)
  if (linesTotal <= maxLines && encoded.length <= maxBytes) return null
  let head = text
  if (linesTotal > maxLines) {
    let cut = -1
    for (let i = 0; i < maxLines; i++) cut = head.indexOf("\n", cut + 1)
    head = head.slice(0, cut + 1)
  }
  let headBytes = encoder.encode(head)
  if (headBytes.length > maxBytes) {
    head = new TextDecoder("utf-8", { fatal: false }).decode(headBytes.subarray(0, maxBytes)).replace(/\uFFFD$/, "")
    const lastNewline = head.lastIndexOf("\n")
    if (lastNewline > 0) head = head.slice(0, lastNewline + 1)
    headBytes = encoder.encode(head)
  }
  let shownLines = 0
  for (let at = head.indexOf("\n"); at !== -1; at = head.indexOf("\n", at + 1)) shownLines++
  if (head && !head.endsWith("\n")) shownLines++
  const path = spill(encoded, spillDir, label, ".txt")
  const notice =
    `\n[output truncated: showing ${grouped(shownLines)} of ${grouped(linesTotal)} lines ` +
    `(${grouped(headBytes.length)} of ${grouped(encoded.length)} bytes); the full output is in ${path}]`
  return { text: head + notice, path }
}

/** Write `data` to a new spill file (mode 0600) in `spillDir`; return its path. */
export function spill(data, spillDir, label, suffix) {
  mkdirSync(spillDir, { recursive: true, mode: 0o700 })
  for (;;) {
    const random = [...crypto.getRandomValues(new Uint8Array(6))].map((b) => b.toString(16).padStart(2, "0")).join("")
    const path = join(spillDir, `${label}-${random}${suffix}`)
    let fd
    try {
      fd = openSync(path, "wx", 0o600)
    } catch (error) {
      if (error?.code === "EEXIST") continue
      throw error
    }
    try {
      let written = 0
      while (written < data.length) written += writeSync(fd, data, written)
    } finally {
      closeSync(fd)
    }
    return path
  }
}

function plainObject(value) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false
  const proto = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

function copilotResult(value) {
  return plainObject(value) && typeof value.textResultForLlm === "string" && typeof value.resultType === "string"
}

function openCodeResult(value) {
  return plainObject(value) && typeof value.output === "string" && Object.keys(value).every((k) => ["output", "title", "metadata", "attachments"].includes(k))
}

/** The CallToolResult (JSON bytes) for what tool `name` returned. */
export function makeResult(name, value, limits) {
  if (typeof value === "string" && value.length <= limits.truncateBytes / 4 && !value.includes("\n")) {
    return encoder.encode(TEXT_HEAD + JSON.stringify(value) + TEXT_TAIL) // the common case
  }
  let text
  let structured
  let isError = false
  const blocks = []
  if (typeof value === "string") text = value
  else if (value === undefined || value === null) text = null
  else if (copilotResult(value)) {
    text = value.textResultForLlm || (typeof value.error === "string" ? value.error : "")
    isError = COPILOT_ERRORS.has(value.resultType)
    for (const binary of Array.isArray(value.binaryResultsForLlm) ? value.binaryResultsForLlm : []) {
      if (binary?.type === "image" && typeof binary.data === "string") {
        blocks.push({ type: "image", data: binary.data, mimeType: String(binary.mimeType ?? "image/png") })
      }
    }
  } else if (openCodeResult(value)) text = value.output
  else if (value instanceof Uint8Array) text = new TextDecoder().decode(value)
  else {
    text = JSON.stringify(value, (_key, item) => (typeof item === "bigint" ? item.toString() : item))
    if (text === undefined) text = String(value)
    if (plainObject(value)) structured = JSON.parse(text)
  }
  let meta
  if (text !== null) {
    const cut = truncate(text, limits.truncateLines, limits.truncateBytes, limits.spillDir, name)
    if (cut !== null) {
      text = cut.text
      meta = { "atomic/fullOutput": cut.path }
    }
  }
  const result = { content: [...(text === null ? [] : [{ type: "text", text }]), ...blocks] }
  if (structured !== undefined) result.structuredContent = structured
  if (meta !== undefined) result._meta = meta
  if (isError) result.isError = true
  const encoded = encoder.encode(JSON.stringify(result))
  if (encoded.length > limits.maxResultBytes) {
    const path = spill(encoded, limits.spillDir, name, ".json")
    return errorResult(
      `Tool '${name}' returned a result of ${grouped(encoded.length)} bytes, more than the ${grouped(limits.maxResultBytes)} ` +
        `bytes a message may carry (max_message_bytes); the whole result is in ${path}`,
    )
  }
  return encoded
}

/** What a tool that threw answers with: the error and the tool's own frames. */
export function exceptionText(name, error, runtimeDir) {
  if (error instanceof Error) {
    const frames = String(error.stack ?? "")
      .split("\n")
      .slice(1)
      .filter((line) => !line.includes(runtimeDir) && !line.includes("node:internal"))
    const head = `Tool '${name}' raised ${error.name}: ${error.message}`
    return frames.length ? `${head}\n\n${frames.join("\n")}` : head
  }
  return `Tool '${name}' raised ${typeof error === "string" ? error : JSON.stringify(error) ?? String(error)}`
}
