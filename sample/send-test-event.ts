/**
 * `npm run sample:send [orders|fulfilment|fulfilment-async]`: the newcomer's demo. Sends one correctly signed test
 * event twice to the running sample and shows that the first delivery was processed and the
 * second replayed. Reads PORT and STRIPE_WEBHOOK_SECRET like the sample does.
 */
import { loadSampleConfig } from './config/sample-config.js';
import { signPayload, testEvent, type SampleEventType } from './demo/stripe-test-events.js';

const ENDPOINTS: Record<string, { path: string; type: SampleEventType }> = {
  orders: { path: '/webhooks/stripe/orders', type: 'payment_intent.succeeded' },
  fulfilment: { path: '/webhooks/stripe/fulfilment', type: 'checkout.session.completed' },
  'fulfilment-async': { path: '/webhooks/stripe/fulfilment-async', type: 'checkout.session.completed' },
};

const which = process.argv[2] ?? 'orders';
const endpoint = ENDPOINTS[which];
if (!endpoint) {
  console.error(`Unknown endpoint "${which}": use one of ${Object.keys(ENDPOINTS).join(', ')}`);
  process.exit(2);
}

const config = loadSampleConfig();
const url = `http://localhost:${config.port}${endpoint.path}`;
const event = testEvent(endpoint.type);
// Signed once, sent twice: a redelivery carries the same event, as Stripe's retries do.
const payload = JSON.stringify(event);
const signature = signPayload(payload, config.webhookSecret);

console.log(`Sending ${event.type} ${event.id} to ${url}, twice\n`);
const outcomes: string[] = [];
for (const ordinal of ['1st', '2nd']) {
  const sent = performance.now();
  let response: Response;
  try {
    response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'stripe-signature': signature },
      body: payload,
    });
  } catch (error) {
    console.error(`Could not reach the sample at ${url} (${String(error)}). Is \`npm run sample\` running?`);
    process.exit(1);
  }
  const body = await response.text();
  const replayed = response.headers.get('idempotent-replayed') === 'true';
  const outcome = response.status !== 200 ? 'failed' : replayed ? 'replayed' : 'processed';
  outcomes.push(outcome);
  const detail = replayed ? '(Idempotent-Replayed: true, the handler did not run again)' : body;
  const ms = Math.round(performance.now() - sent);
  console.log(`  ${ordinal} delivery → ${response.status} ${outcome.padEnd(9)} in ${ms} ms ${detail}`);
}

const asExpected = outcomes[0] === 'processed' && outcomes[1] === 'replayed';
console.log(asExpected ? '\nProcessed once, replayed once.' : '\nUnexpected outcome: see the sample’s log.');
if (asExpected && which === 'fulfilment-async') {
  console.log('Acknowledged once its job committed; a worker fulfils it now: see the sample’s log.');
}
process.exit(asExpected ? 0 : 1);
