// The worker's channel to the daemon, and what the tool prints.
//
// The channel is the socket the daemon made for this worker (descriptor 3): frames in, frames out
// (msgpack.mjs). When the daemon closes it the worker exits, whatever its tools are doing.
//
// What a tool prints never reaches the channel as anything but an "output" message: descriptors 1
// and 2 (console.*, process.stdout, and the programs it starts with the descriptors they inherit)
// are pipes that a drain process reads (worker/jsexec.py) as fast as they are written, with
// the bounds of a Python worker's output (worker/output.py); its "output" frames arrive whole
// on descriptor 4 and are passed on as they are (`relayOutput`).

import { FrameReader, encodeFrame } from "./msgpack.mjs"

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
  const { Socket } = await import("node:net") // Node only: Bun's own sockets cost it ~4 MiB less
  return new NodeChannel(new Socket({ fd, readable: true, writable: true }), received)
}

class NodeChannel {
  constructor(socket, received) {
    this.socket = socket
    this.socket.on("data", received)
    this.socket.on("end", exit)
    this.socket.on("close", exit)
    this.socket.on("error", exit)
  }

  send(message) {
    this.socket.write(encodeFrame(message))
  }

  sendFrame(frame) {
    this.socket.write(frame)
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
    this.sendFrame(encodeFrame(message))
  }

  sendFrame(frame) {
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

/** Pass on, whole, the frames the drain process sends on descriptor `fd`. */
export async function relayOutput(fd, channel) {
  let pending = new Uint8Array(0)
  const received = (chunk) => {
    const data = pending.length ? concat(pending, chunk) : chunk
    let at = 0
    while (data.length - at >= 4) {
      const length = ((data[at] << 24) >>> 0) + (data[at + 1] << 16) + (data[at + 2] << 8) + data[at + 3]
      if (data.length - at - 4 < length) break
      channel.sendFrame(data.slice(at, at + 4 + length)) // built by the drain: an "output" message
      at += 4 + length
    }
    pending = data.slice(at)
  }
  if (typeof Bun !== "undefined") {
    await Bun.connect({ fd, socket: { data: (_socket, chunk) => received(new Uint8Array(chunk)), error() {}, close() {} } })
    return
  }
  const { Socket } = await import("node:net")
  const socket = new Socket({ fd, readable: true, writable: false })
  socket.on("data", (chunk) => received(new Uint8Array(chunk)))
  socket.on("error", () => {})
  socket.unref() // the drain ends with this process: it never keeps it alive
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length)
  out.set(a)
  out.set(b, a.length)
  return out
}
