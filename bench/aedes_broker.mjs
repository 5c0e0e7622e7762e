// Starts an aedes broker on a loopback port for bench/mqtt_bench.py, with aedes's defaults
// (in-memory persistence and emitter). aedes is installed by bench/brokers.py into DEPS_DIR.
//
//     node aedes_broker.mjs PORT DEPS_DIR
import { createServer } from 'node:net'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const port = Number(process.argv[2])
const entry = join(process.argv[3], 'node_modules', 'aedes', 'aedes.js')
const { Aedes } = await import(pathToFileURL(entry).href)
const broker = await Aedes.createBroker()
const server = createServer(broker.handle)
server.listen(port, '127.0.0.1', () => console.log(`aedes listening on 127.0.0.1:${port}`))

const stop = () => broker.close(() => process.exit(0))
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
