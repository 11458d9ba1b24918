/** The fields of a Stripe event the bench handlers read. */
export interface BenchEvent {
  id: string;
  type: string;
  data: { object: { amount: number; currency: string; customer: string } };
}

const CUSTOMERS = ['cus_QbX2n8Lk4TzR1m', 'cus_PzA9c3Hw7YvE2q', 'cus_NfK5r1Dq8UsM6t', 'cus_MtY7e4Bj2WxC9p'];

/**
 * A `payment_intent.succeeded` event shaped like Stripe's, about 1 KB of JSON. Built by string
 * concatenation: the load process must spend its CPU sending, not serialising.
 */
export function stripeEventBody(id: string, sequence: number): string {
  const amount = 1000 + (sequence % 9000);
  const customer = CUSTOMERS[sequence % CUSTOMERS.length];
  const created = 1_730_000_000 + sequence;
  const intent = `pi_3Q${id.slice(-20)}`;
  return (
    `{"id":"${id}","object":"event","api_version":"2024-06-20","created":${created},` +
    `"data":{"object":{"id":"${intent}","object":"payment_intent","amount":${amount},` +
    `"amount_capturable":0,"amount_received":${amount},"capture_method":"automatic","client_secret":null,` +
    `"confirmation_method":"automatic","created":${created},"currency":"eur","customer":"${customer}",` +
    `"description":"Order #${sequence}","invoice":null,"last_payment_error":null,"latest_charge":"ch_3Q${id.slice(-20)}",` +
    `"livemode":false,"metadata":{"order_id":"ord_${sequence}","cart":"cart_8f1c2d"},"payment_method":"pm_1Qx7cD2eZvKYlo2C",` +
    `"payment_method_types":["card"],"receipt_email":"jenny.rosen@example.com","setup_future_usage":null,` +
    `"shipping":{"name":"Jenny Rosen","address":{"line1":"510 Townsend St","city":"San Francisco","country":"US","postal_code":"94103","state":"CA"}},` +
    `"statement_descriptor":null,"status":"succeeded","transfer_data":null,"transfer_group":null}},` +
    `"livemode":false,"pending_webhooks":1,"request":{"id":"req_${id.slice(-14)}","idempotency_key":"${intent}-confirm"},` +
    `"type":"payment_intent.succeeded"}`
  );
}

/**
 * Event ids unique across a whole bench run: `evt_` + run tag + cell tag + a counter, 28
 * characters like Stripe's. The cell tag lets the effect check find one cell's rows.
 */
export function eventIds(runTag: string, cellTag: string): { prefix: string; next(): string } {
  const prefix = `evt_${runTag}${cellTag}`;
  let counter = 0;
  return {
    prefix,
    next: () => prefix + (counter++).toString(36).padStart(28 - 4 - runTag.length - cellTag.length, '0'),
  };
}
