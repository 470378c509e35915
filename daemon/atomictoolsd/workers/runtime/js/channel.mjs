// The worker's channel to the daemon, and what the tool prints.
//
// The channel is the socket the daemon made for this worker (descriptor 3): frames in, frames out
// (msgpack.mjs). When the daemon closes it the worker exits, whatever its tools are doing.
//
// What a tool prints never reaches the channel as anything but an "output" message: console.* and
// process.stdout/stderr are forwarded in this process; descriptors 1 and 2 are pipes (descriptors 4
// and 5 are their read ends), so what a program the tool starts writes is forwarded too. The same
// bounds as a Python worker's (workers/runtime/output.py): at most CHUNK_BYTES a message, RATE_BYTES
// a second on average in bursts of BURST_BYTES; what is over is read and counted as dropped, and a
// quiet second after a flood says how much was.

import { Socket } from "node:net"
import { fstatSync } from "node:fs"
import { formatWithOptions } from "node:util"

import { FrameReader, encodeFrame } from "./msgpack.mjs"

export const CHUNK_BYTES = 8192
export const RATE_BYTES = 8192
export const BURST_BYTES = 65536
const QUIET_MS = 1000

const exit = () => process.exit(0) // the daemon closed the channel (or died): no one to answer

/** The channel on descriptor `fd`; `onMessage` gets each message the daemon sends. */
export async function openChannel(fd, onMessage) {
  const reader = new FrameReader()
  const received = (chunk) => {
    let messages
    try {
      messages = reader.feed(chunk)
    } catch {
      process.exit(70) // the daemon sent what it never sends: nothing after it can be read
    }
    for (const message of messages) onMessage(message)
  }
  if (typeof Bun !== "undefined") {
    // Bun's node:net refuses to write on a socket made from a descriptor: its own sockets do not.
    const channel = new BunChannel()
    channel.socket = await Bun.connect({
      fd,
      socket: { data: (_socket, chunk) => received(chunk), drain: () => channel.drain(), end: exit, close: exit, error: exit },
    })
    return channel
  }
  return new NodeChannel(fd, received)
}

class NodeChannel {
  constructor(fd, received) {
    this.socket = new Socket({ fd, readable: true, writable: true })
    this.socket.on("data", received)
    this.socket.on("end", exit)
    this.socket.on("close", exit)
    this.socket.on("error", exit)
  }

  send(message) {
    this.socket.write(encodeFrame(message))
  }

  /** Resolves once everything sent so far is written. */
  flush() {
    return new Promise((resolve) => this.socket.write(new Uint8Array(0), () => resolve()))
  }
}

class BunChannel {
  constructor() {
    this.socket = null
    this.queue = [] // what the socket did not take yet, in order
    this.waiting = []
  }

  send(message) {
    const frame = encodeFrame(message)
    if (this.queue.length) {
      this.queue.push(frame)
      return
    }
    const written = this.socket.write(frame)
    if (written < frame.length) this.queue.push(frame.subarray(Math.max(0, written)))
  }

  drain() {
    while (this.queue.length) {
      const frame = this.queue[0]
      const written = this.socket.write(frame)
      if (written < frame.length) {
        this.queue[0] = frame.subarray(Math.max(0, written))
        return
      }
      this.queue.shift()
    }
    for (const resolve of this.waiting.splice(0)) resolve()
  }

  flush() {
    return this.queue.length ? new Promise((resolve) => this.waiting.push(resolve)) : Promise.resolve()
  }
}

class Stream {
  constructor(forwarder, fd) {
    this.forwarder = forwarder
    this.fd = fd
    this.dropped = 0
  }

  write(data) {
    const forwarder = this.forwarder
    forwarder.refill()
    if (forwarder.tokens < 1) {
      this.dropped += data.length
      forwarder.quietReport()
      return
    }
    const kept = data.length > CHUNK_BYTES ? data.subarray(0, CHUNK_BYTES) : data
    forwarder.tokens -= kept.length
    forwarder.send(["output", this.fd, kept, this.dropped + data.length - kept.length])
    this.dropped = 0
  }
}

export class OutputForwarder {
  constructor(channel) {
    this.channel = channel
    this.tokens = BURST_BYTES
    this.last = performance.now()
    this.streams = { 1: new Stream(this, 1), 2: new Stream(this, 2) }
    this.timer = null
  }

  send(message) {
    this.channel.send(message)
  }

  refill() {
    const now = performance.now()
    this.tokens = Math.min(BURST_BYTES, this.tokens + ((now - this.last) / 1000) * RATE_BYTES)
    this.last = now
  }

  quietReport() {
    if (this.timer !== null) return
    this.timer = setTimeout(() => {
      this.timer = null
      for (const stream of Object.values(this.streams)) {
        if (stream.dropped) {
          this.send(["output", stream.fd, new Uint8Array(0), stream.dropped])
          stream.dropped = 0
        }
      }
    }, QUIET_MS)
    this.timer.unref?.()
  }

  /** Forward what this process prints (console.*, process.stdout/stderr) and what is written to
   * descriptors 1 and 2 (read from `pipes`, `{1: fd, 2: fd}`). */
  capture(pipes) {
    const encoder = new TextEncoder()
    const toBytes = (chunk) => (typeof chunk === "string" ? encoder.encode(chunk) : new Uint8Array(chunk))
    for (const fd of [1, 2]) {
      const stream = this.streams[fd]
      const target = fd === 1 ? process.stdout : process.stderr
      target.write = (chunk, encoding, callback) => {
        stream.write(toBytes(chunk))
        const done = typeof encoding === "function" ? encoding : callback
        if (typeof done === "function") queueMicrotask(done)
        return true
      }
    }
    const print = (fd) => (...args) => this.streams[fd].write(encoder.encode(formatWithOptions({ colors: false }, ...args) + "\n"))
    for (const name of ["log", "info", "debug", "trace"]) console[name] = print(1)
    for (const name of ["error", "warn"]) console[name] = print(2)
    for (const [fd, readEnd] of Object.entries(pipes)) this.readPipe(Number(fd), readEnd)
  }

  readPipe(fd, readEnd) {
    try {
      if (!fstatSync(readEnd).isFIFO()) return
    } catch {
      return
    }
    const forward = (chunk) => this.streams[fd].write(new Uint8Array(chunk))
    if (typeof Bun !== "undefined") {
      ;(async () => {
        for await (const chunk of Bun.file(readEnd).stream()) forward(chunk)
      })().catch(() => {})
      return
    }
    const socket = new Socket({ fd: readEnd, readable: true, writable: false })
    socket.on("data", forward)
    socket.on("error", () => {})
    socket.unref() // a pipe only this process and its children write to never keeps it alive
  }
}
