// CRC-32 (zlib's), for the fingerprints of the files a worker loaded: the daemon compares them with
// the files on disk to tell a module read whole from one read while it was being written.

let table = null

function slow(bytes) {
  if (table === null) {
    table = new Int32Array(256)
    for (let n = 0; n < 256; n++) {
      let c = n
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
      table[n] = c
    }
  }
  let crc = -1
  for (let i = 0; i < bytes.length; i++) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8)
  return (crc ^ -1) >>> 0
}

// Bun's own, else Node's (node:zlib costs Bun ~6 MiB of memory: never imported there).
export const crc32 =
  typeof Bun !== "undefined"
    ? (bytes) => Bun.hash.crc32(bytes) >>> 0
    : await import("node:zlib").then((zlib) => (typeof zlib.crc32 === "function" ? (bytes) => zlib.crc32(bytes) >>> 0 : slow))
