// A second MQTT broker implementation for the bridge tests: aedes (npm), on 127.0.0.1 on the port given.
// Usage: node aedes_broker.mjs <folder holding node_modules/aedes> <port>
// Prints one line "aedes VERSION listening on 127.0.0.1:PORT" once it accepts connections; stopped by PID
// (SIGTERM closes the listener and the broker). Connections and client errors are logged one line each.
import net from 'node:net'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const [folder, portText] = process.argv.slice(2)
const port = Number(portText)
if (!folder || !Number.isInteger(port) || port <= 0) {
  console.error('usage: node aedes_broker.mjs <folder holding node_modules/aedes> <port>')
  process.exit(2)
}
const root = join(folder, 'node_modules', 'aedes')
const version = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version
const { Aedes } = await import(pathToFileURL(join(root, 'aedes.js')).href)
const broker = await Aedes.createBroker()
broker.on('client', (client) => console.log(`client connected: ${client.id}`))
broker.on('clientDisconnect', (client) => console.log(`client disconnected: ${client.id}`))
broker.on('clientError', (client, err) => console.log(`client error: ${client.id}: ${err.message}`))
broker.on('connectionError', (client, err) => console.log(`connection error: ${err.message}`))
const server = net.createServer(broker.handle)
server.listen(port, '127.0.0.1', () => console.log(`aedes ${version} listening on 127.0.0.1:${port}`))
process.on('SIGTERM', () => {
  server.close()
  broker.close(() => process.exit(0))
})
