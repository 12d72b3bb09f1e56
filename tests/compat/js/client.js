'use strict'
// nsqjs scenarios for tests/compat/test_nsqjs.py; the contract is in tests/support/clients.py.
// Run: node client.js SCENARIO < params.json. Prints one JSON line. Uses nsqjs's public API (Writer,
// Reader, Message); the hooks on the connection state machine only *record* the IDENTIFY/AUTH
// responses the client parsed.

const nsq = require('nsqjs')
const {ConnectionState, WriterConnectionState} = require('nsqjs/lib/nsqdconnection')

const OUT = {
  timed_out: false,
  results: [],
  deliveries: [],
  errors: [],
  identify: [],
  auth: [],
  heartbeats: 0,
}

const hooked = new Set() // node-state binds every property of a state: keep markers outside

function hook(cls, stateName, eventName, record) {
  const state = cls.prototype.states[stateName]
  if (!state || hooked.has(state)) return
  const orig = state[eventName]
  state[eventName] = function (...args) {
    const r = orig.apply(this, args)
    try {
      record(this, ...args)
    } catch (e) {
      // recording must never change the client's behaviour
    }
    return r
  }
  hooked.add(state)
}

for (const cls of [ConnectionState, WriterConnectionState]) {
  hook(cls, 'IDENTIFY_RESPONSE', 'response', (sm) => OUT.identify.push(sm.identifyResponse))
  hook(cls, 'AUTH_RESPONSE', 'response', (sm) => OUT.auth.push(sm.conn.auth))
}
hook(ConnectionState, 'READY_RECV', 'response', (sm, data) => {
  if (data.toString() === '_heartbeat_') OUT.heartbeats += 1
})

function errText(err) {
  if (!err) return 'unknown error'
  return err.message || String(err)
}

function connOptions(p) {
  const fs = require('fs')
  const c = p.conn || {}
  const o = {}
  if (c.tls) {
    o.tls = true
    if (c.ca) {
      o.ca = fs.readFileSync(c.ca)
      o.tlsVerification = true
    } else {
      o.tlsVerification = false
    }
    if (c.cert) {
      o.cert = fs.readFileSync(c.cert)
      o.key = fs.readFileSync(c.key)
    }
  }
  if (c.snappy) o.snappy = true
  if (c.deflate) {
    o.deflate = true
    if (c.deflate_level) o.deflateLevel = c.deflate_level
  }
  if (c.auth_secret) o.authSecret = c.auth_secret
  if (c.msg_timeout_ms) o.messageTimeout = c.msg_timeout_ms
  if (c.heartbeat_s) o.heartbeatInterval = c.heartbeat_s
  return o
}

function splitAddr(addr) {
  const i = addr.lastIndexOf(':')
  return [addr.slice(0, i), Number(addr.slice(i + 1))]
}

let finished = false
let closing = false // errors caused by our own close() are not the server's
const closers = []

function finish() {
  if (finished) return
  finished = true
  // never close from inside an nsqjs callback: its state machine is not re-entrant
  setTimeout(() => {
    closing = true
    for (const close of closers) {
      try {
        close()
      } catch (e) {
        // closing a dead connection may throw; the result is already recorded
      }
    }
    setTimeout(() => {
      process.stdout.write(JSON.stringify(OUT) + '\n', () => process.exit(0))
    }, 200)
  }, 0)
}

function startDeadline(p) {
  setTimeout(() => {
    if (!finished) {
      OUT.timed_out = true
      finish()
    }
  }, (p.deadline_s || 20) * 1000).unref()
  // keep the process alive until finish() exits it
  setInterval(() => {}, 1000)
}

// -- publish --------------------------------------------------------------------------------
function scenarioPublish(p) {
  const [host, port] = splitAddr(p.nsqd)
  const w = new nsq.Writer(host, port, connOptions(p))
  closers.push(() => w.close())
  const ops = p.ops.slice()
  let started = false

  const nextOp = () => {
    if (finished) return
    const op = ops.shift()
    if (!op) return finish()
    const done = (err) => {
      if (err) {
        OUT.results.push('ERR ' + errText(err))
        return finish()
      }
      OUT.results.push('OK')
      nextOp()
    }
    try {
      if (op.op === 'pub') {
        w.publish(op.topic, Buffer.from(op.body, 'hex'), done)
      } else if (op.op === 'mpub') {
        w.publish(op.topic, op.bodies.map((b) => Buffer.from(b, 'hex')), done)
      } else if (op.op === 'dpub') {
        // nsqjs 0.13.0 deferPublish needs the message wrapped in an array (see README)
        w.deferPublish(op.topic, [Buffer.from(op.body, 'hex')], op.delay_ms, done)
      } else {
        throw new Error('unknown op ' + op.op)
      }
    } catch (e) {
      OUT.results.push('ERR ' + errText(e))
      finish()
    }
  }

  w.on('ready', () => {
    if (!started) {
      started = true
      nextOp()
    }
  })
  w.on('error', (err) => {
    if (closing) return
    OUT.errors.push(errText(err))
    if (!started) {
      started = true
      OUT.results.push('ERR ' + errText(err))
      finish()
    }
  })
  w.connect()
}

// -- consume --------------------------------------------------------------------------------
function record(reader, msg, action) {
  OUT.deliveries.push({
    reader,
    id: msg.id,
    body: msg.body.toString('hex'),
    attempts: msg.attempts,
    timestamp_ns: msg.timestamp.toString(),
    recv_ns: (BigInt(Date.now()) * 1000000n).toString(),
    action,
  })
}

function makeReader(p, name, mode, maxInFlight, onChange) {
  const state = {fins: 0, held: 0}
  const r = new nsq.Reader(p.topic, p.channel, Object.assign({
    nsqdTCPAddresses: [p.nsqd],
    maxInFlight,
    maxAttempts: 0,
    lookupdPollInterval: 60,
  }, connOptions(p)))
  closers.push(() => r.close())
  const fin = (msg, action) => {
    record(name, msg, action)
    msg.finish()
    state.fins += 1
    onChange()
  }
  r.on('message', (msg) => {
    const first = msg.attempts === 1
    const limit = p.fin_limit || 0
    if (mode === 'hold' || (mode === 'hold_first' && first) || (limit && state.fins >= limit)) {
      record(name, msg, 'hold')
      state.held += 1
      onChange()
    } else if (first && (p.late_fin_bodies || []).includes(msg.body.toString('hex'))) {
      record(name, msg, 'hold')
      setTimeout(() => {
        record(name, msg, 'late-fin')
        msg.finish()
      }, p.late_fin_ms || 2500)
    } else if (mode === 'req' && first) {
      record(name, msg, 'req')
      msg.requeue(p.req_delay_ms || 0, false)
    } else if (mode === 'touch' && first) {
      let left = p.touches || 3
      const interval = p.touch_interval_ms || 500
      const tick = () => {
        if (left > 0) {
          left -= 1
          msg.touch()
          setTimeout(tick, interval)
        } else {
          fin(msg, 'touch+fin')
        }
      }
      setTimeout(tick, interval)
    } else {
      fin(msg, 'fin')
    }
  })
  r.on('error', (err) => {
    if (closing) return
    OUT.errors.push(errText(err))
    if (p.stop_on_error) setTimeout(finish, 300)
  })
  r.connect()
  return {reader: r, state}
}

function finishAfterIdle(p, done) {
  let fired = false
  return () => {
    if (!fired && done()) {
      fired = true
      setTimeout(finish, (p.idle_s || 0) * 1000)
    }
  }
}

function scenarioConsume(p) {
  const expect = p.expect || 0
  let a = null
  const want = new Set(p.expect_bodies || [])
  const done = () => {
    if (want.size > 0) {
      const got = new Set(OUT.deliveries.filter((d) => d.action !== 'hold').map((d) => d.body))
      return [...want].every((b) => got.has(b))
    }
    return a && expect > 0 && a.state.fins >= expect
  }
  const check = finishAfterIdle(p, done)
  a = makeReader(p, 'A', p.mode || 'fin', p.max_in_flight || 10, () => check())
}

function scenarioHandoff(p) {
  const expect = p.expect || 1
  let b = null
  const check = finishAfterIdle(p, () => b && b.state.fins >= expect)
  const a = makeReader(p, 'A', 'hold', expect, () => {
    if (a.state.held >= expect && !b) {
      a.reader.pause() // RDY 0: only B may get the timed-out messages
      b = makeReader(p, 'B', 'fin', expect, () => check())
    }
  })
}

const SCENARIOS = {publish: scenarioPublish, consume: scenarioConsume, handoff: scenarioHandoff}

function main() {
  const scenario = process.argv[2]
  const p = JSON.parse(require('fs').readFileSync(0, 'utf8'))
  startDeadline(p)
  try {
    SCENARIOS[scenario](p)
  } catch (e) {
    OUT.crash = e.stack || String(e)
    process.stdout.write(JSON.stringify(OUT) + '\n', () => process.exit(0))
  }
}

// nsqjs throws from stream callbacks (e.g. zlib on a truncated deflate stream): report it as an
// error of this run instead of dying without output
process.on('uncaughtException', (e) => {
  if (closing) return
  OUT.errors.push('uncaughtException: ' + (e.stack || String(e)))
  finish()
})

main()
