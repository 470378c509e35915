// The worker protocol's framing and encoding, as protocol.py writes it: a 4-byte big-endian
// length, then one msgpack value. Only what the protocol's messages hold is understood: nil,
// booleans, integers, floats, strings, binary, arrays and maps. A value the daemon declares as a
// float (a load time, progress) is written as a float whatever it holds (`float64(x)`); any other
// number is written as an integer when it is one.

const encoder = new TextEncoder()
const decoder = new TextDecoder("utf-8", { fatal: false })

/** A number the daemon reads as a float, written as a msgpack float64 even when integral. */
export class Float64 {
  constructor(value) {
    this.value = value
  }
}

export const float64 = (value) => new Float64(value)

class Writer {
  constructor() {
    this.buffer = new Uint8Array(256)
    this.view = new DataView(this.buffer.buffer)
    this.length = 4 // the frame's length goes first, once known
  }

  reserve(count) {
    const needed = this.length + count
    if (needed <= this.buffer.length) return
    let size = this.buffer.length * 2
    while (size < needed) size *= 2
    const grown = new Uint8Array(size)
    grown.set(this.buffer.subarray(0, this.length))
    this.buffer = grown
    this.view = new DataView(grown.buffer)
  }

  byte(value) {
    this.reserve(1)
    this.buffer[this.length++] = value
  }

  bytes(data) {
    this.reserve(data.length)
    this.buffer.set(data, this.length)
    this.length += data.length
  }

  head(small, bits8, bits16, bits32, size, smallLimit) {
    if (small !== null && size < smallLimit) this.byte(small | size)
    else if (bits8 !== null && size < 0x100) {
      this.reserve(2)
      this.buffer[this.length++] = bits8
      this.buffer[this.length++] = size
    } else if (size < 0x10000) {
      this.reserve(3)
      this.buffer[this.length] = bits16
      this.view.setUint16(this.length + 1, size)
      this.length += 3
    } else {
      this.reserve(5)
      this.buffer[this.length] = bits32
      this.view.setUint32(this.length + 1, size)
      this.length += 5
    }
  }

  integer(value) {
    if (value >= 0) {
      if (value < 0x80) return this.byte(value)
      if (value < 0x100) return this.fixed(0xcc, 1, (at) => this.view.setUint8(at, value))
      if (value < 0x10000) return this.fixed(0xcd, 2, (at) => this.view.setUint16(at, value))
      if (value < 0x100000000) return this.fixed(0xce, 4, (at) => this.view.setUint32(at, value))
      return this.fixed(0xcf, 8, (at) => this.view.setBigUint64(at, BigInt(value)))
    }
    if (value >= -32) return this.byte(value & 0xff)
    if (value >= -0x80) return this.fixed(0xd0, 1, (at) => this.view.setInt8(at, value))
    if (value >= -0x8000) return this.fixed(0xd1, 2, (at) => this.view.setInt16(at, value))
    if (value >= -0x80000000) return this.fixed(0xd2, 4, (at) => this.view.setInt32(at, value))
    return this.fixed(0xd3, 8, (at) => this.view.setBigInt64(at, BigInt(value)))
  }

  fixed(code, size, write) {
    this.reserve(size + 1)
    this.buffer[this.length] = code
    write(this.length + 1)
    this.length += size + 1
  }

  value(value) {
    if (value === null || value === undefined) return this.byte(0xc0)
    switch (typeof value) {
      case "boolean":
        return this.byte(value ? 0xc3 : 0xc2)
      case "number":
        if (Number.isSafeInteger(value)) return this.integer(value)
        return this.fixed(0xcb, 8, (at) => this.view.setFloat64(at, value))
      case "bigint": // whole, as 64 bits: a file's mtime in ns is past what a Number holds exactly
        if (value >= 0n) return this.fixed(0xcf, 8, (at) => this.view.setBigUint64(at, value))
        return this.fixed(0xd3, 8, (at) => this.view.setBigInt64(at, value))
      case "string": {
        const data = encoder.encode(value)
        this.head(0xa0, 0xd9, 0xda, 0xdb, data.length, 32)
        return this.bytes(data)
      }
      default:
        break
    }
    if (value instanceof Float64) return this.fixed(0xcb, 8, (at) => this.view.setFloat64(at, value.value))
    if (value instanceof Uint8Array) {
      this.head(null, 0xc4, 0xc5, 0xc6, value.length, 0)
      return this.bytes(value)
    }
    if (Array.isArray(value)) {
      this.head(0x90, null, 0xdc, 0xdd, value.length, 16)
      for (const item of value) this.value(item)
      return
    }
    const entries = Object.entries(value).filter(([, item]) => item !== undefined && typeof item !== "function")
    this.head(0x80, null, 0xde, 0xdf, entries.length, 16)
    for (const [key, item] of entries) {
      this.value(key)
      this.value(item)
    }
  }
}

/** One message, framed: its length, then its msgpack bytes. */
export function encodeFrame(message) {
  const writer = new Writer()
  writer.value(message)
  writer.view.setUint32(0, writer.length - 4)
  return writer.buffer.subarray(0, writer.length)
}

class Reader {
  constructor(data) {
    this.data = data
    this.view = new DataView(data.buffer, data.byteOffset, data.byteLength)
    this.at = 0
  }

  take(count) {
    const start = this.at
    this.at += count
    if (this.at > this.data.length) throw new Error("a truncated message")
    return start
  }

  string(length) {
    const start = this.take(length)
    return decoder.decode(this.data.subarray(start, start + length))
  }

  binary(length) {
    const start = this.take(length)
    return this.data.subarray(start, start + length)
  }

  array(length) {
    const out = new Array(length)
    for (let i = 0; i < length; i++) out[i] = this.value()
    return out
  }

  map(length) {
    const out = {}
    for (let i = 0; i < length; i++) {
      const key = this.value()
      out[key] = this.value()
    }
    return out
  }

  value() {
    const code = this.data[this.take(1)]
    if (code < 0x80) return code
    if (code < 0x90) return this.map(code & 0x0f)
    if (code < 0xa0) return this.array(code & 0x0f)
    if (code < 0xc0) return this.string(code & 0x1f)
    if (code >= 0xe0) return code - 0x100
    const view = this.view
    switch (code) {
      case 0xc0: return null
      case 0xc2: return false
      case 0xc3: return true
      case 0xc4: return this.binary(view.getUint8(this.take(1)))
      case 0xc5: return this.binary(view.getUint16(this.take(2)))
      case 0xc6: return this.binary(view.getUint32(this.take(4)))
      case 0xca: return view.getFloat32(this.take(4))
      case 0xcb: return view.getFloat64(this.take(8))
      case 0xcc: return view.getUint8(this.take(1))
      case 0xcd: return view.getUint16(this.take(2))
      case 0xce: return view.getUint32(this.take(4))
      case 0xcf: return Number(view.getBigUint64(this.take(8)))
      case 0xd0: return view.getInt8(this.take(1))
      case 0xd1: return view.getInt16(this.take(2))
      case 0xd2: return view.getInt32(this.take(4))
      case 0xd3: return Number(view.getBigInt64(this.take(8)))
      case 0xd9: return this.string(view.getUint8(this.take(1)))
      case 0xda: return this.string(view.getUint16(this.take(2)))
      case 0xdb: return this.string(view.getUint32(this.take(4)))
      case 0xdc: return this.array(view.getUint16(this.take(2)))
      case 0xdd: return this.array(view.getUint32(this.take(4)))
      case 0xde: return this.map(view.getUint16(this.take(2)))
      case 0xdf: return this.map(view.getUint32(this.take(4)))
      default: throw new Error(`an unknown msgpack code 0x${code.toString(16)}`)
    }
  }
}

export function decode(data) {
  return new Reader(data).value()
}

/** Reassembles frames from chunks of a byte stream; `feed` returns the messages now whole. */
export class FrameReader {
  constructor() {
    this.pending = null
  }

  feed(chunk) {
    let data = this.pending === null ? chunk : concat(this.pending, chunk)
    const messages = []
    let at = 0
    while (data.length - at >= 4) {
      const length = ((data[at] << 24) >>> 0) + (data[at + 1] << 16) + (data[at + 2] << 8) + data[at + 3]
      if (data.length - at - 4 < length) break
      messages.push(decode(data.subarray(at + 4, at + 4 + length)))
      at += 4 + length
    }
    this.pending = at === data.length ? null : data.slice(at)
    return messages
  }
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length)
  out.set(a)
  out.set(b, a.length)
  return out
}
