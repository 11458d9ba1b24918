/** Error and log message factories, so wording stays consistent and testable. Every message lives here. */

const describe = (error: unknown) => (error instanceof Error ? error.message : String(error));

export const keyExtractorThrew = (scope: string, error: unknown) =>
  `Idempotency key extractor of ${scope} threw: ${describe(error)}`;

export const keyNotString = (scope: string, value: unknown) =>
  `Idempotency key of ${scope} must be a string, got ${value === null ? 'null' : typeof value}`;

export const keyEmpty = (scope: string) => `Idempotency key of ${scope} is empty`;

export const keyHasNul = (scope: string) =>
  `Idempotency key of ${scope} contains a NUL character, which PostgreSQL text cannot store`;

export const keyNotWellFormed = (scope: string) =>
  `Idempotency key of ${scope} contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys`;

export const keyTooLong = (scope: string, length: number, max: number) =>
  `Idempotency key of ${scope} is ${length} characters long; the maximum is ${max}`;

export const duplicateInFlight = (key: string) =>
  `Event ${key} is being processed by another delivery; retry later`;

export const databaseUnavailable = (key: string) =>
  `Could not record event ${key}: the database is unavailable; retry later`;

export const transactionAborted = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

export const transactionAbortedLog = (scope: string, key: string) =>
  `Handler of ${scope} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

export const claimFailedLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `Claim of ${scope} key ${key} failed (SQLSTATE ${code ?? 'none'}): ${describe(error)}`;

export const slowTransaction = (scope: string, ms: number, limit: number) =>
  `${scope} held its transaction for ${ms} ms (more than ${limit} ms); if it calls something outside the database, mark it @IdempotentWebhook({ external: true })`;

export const leaseLost = (scope: string, key: string, mine: number, current: number | undefined) =>
  `Lease lost: ${scope} key ${key} finished attempt ${mine} after its lease was taken over (current attempt ${current ?? 'unknown'}); the side effect may have run twice`;

export const completionFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} done after its handler succeeded: ${describe(error)}; the lease will expire and be reported`;

export const statementForgotten = (name: string, code: string) =>
  `The prepared statement ${name} was not what this connection's server session had (SQLSTATE ${code}: DEALLOCATE ALL, DISCARD ALL, or a pooler in transaction mode); it was sent again unprepared`;

export const preparedStatementsOff = (name: string, code: string, misses: number) =>
  `Prepared statements turned off: ${misses} statements (the last ${name}, SQLSTATE ${code}) met server sessions that did not have them as this connection did, as behind a transaction-mode pooler (PgBouncer, Supavisor). The claims now go unprepared; set preparedStatements: false to skip this detection`;

export const releaseFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} failed: ${describe(error)}; it becomes claimable when its lease expires`;

export const expiredLease = (scope: string, key: string, attempts: number, ago: number) =>
  `expired lease: ${scope} key ${key} (attempt ${attempts}) expired ${Math.round(ago / 1000)} s ago; its worker probably died`;

export const moreExpiredLeases = (count: number) => `... and ${count} more expired leases`;

export const poisonEvent = (scope: string, key: string, attempts: number, lastError: string | null) =>
  `poison event: ${scope} key ${key} is not done after ${attempts} attempts${lastError ? ` (last error: ${lastError})` : ''}`;

export const noScheduler = () =>
  'ScheduleModule is not imported: expired leases will not be reported. Import ScheduleModule.forRoot() once in your app, or set reporter: false.';

export const hookFailed = (hook: string, error: unknown) => `${hook} threw: ${describe(error)}`;

export const reportFailed = (error: unknown) => `Expired-lease report failed: ${describe(error)}`;

export const heartbeatFailed = (scope: string, key: string, error: unknown) =>
  `Heartbeat of ${scope} key ${key} failed: ${describe(error)}`;

export const handlerDatabaseFailedLog = (
  scope: string,
  key: string,
  code: string | undefined,
  error: unknown,
) =>
  `Handler of ${scope} key ${key} lost the database (SQLSTATE ${code ?? 'none'}): ${describe(error)}; nothing is marked done, answered as unavailable so the sender retries`;

export const commitAmbiguousLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `COMMIT of ${scope} key ${key} may have committed; the redelivery will tell (SQLSTATE ${code ?? 'none'}): ${describe(error)}`;

export const outsideContext = () =>
  'IdempotencyContext used outside an idempotent handler (@IdempotentWebhook, @Idempotent or IdempotencyService.run)';

export const outsideTransaction = () =>
  '@WebhookTransaction() is only available in an @IdempotentWebhook handler';

export const notExternal = (what: string) => `${what} is only available in external mode handlers`;

export const unsupportedDriver = (type: string) =>
  `IdempotencyModule needs a DataSource on the postgres driver (node-postgres), got type '${type}'`;

export const typeormInternalsMoved = (missing: string[]) =>
  `IdempotencyModule cannot run on this TypeORM: ${missing.join(', ')} moved or changed (see lib/postgres/typeorm-internals.ts). Use a supported TypeORM (0.3.x or 1.x) and report the version`;

export const badClaimOption = (where: string, detail: string) => `${where} ${detail}`;

export const missingKeyFunction = (where: string) =>
  `${where} needs a key function, e.g. { key: (event) => event.id }`;

export const methodNotBound = (scope: string) =>
  `@Idempotent method ${scope} was called on an instance Nest did not create (new, useValue or useFactory): it has no IdempotencyService to claim with, so it did not run`;

export const methodOnFactoryProvider = (where: string, token: string) =>
  `@Idempotent on ${where}: the provider ${token} is built by useValue or useFactory, so Nest cannot inject the IdempotencyService its calls need; provide the class itself (useClass or the class as provider)`;

export const runNeedsScope = () =>
  'IdempotencyService.run needs options with a scope, e.g. { scope: "billing", key }';

export const unsupportedContext = (scope: string, type: string) =>
  `@IdempotentWebhook on ${scope} cannot protect a '${type}' execution context; the handler was not run`;

export const unprotectedHandlers = (problems: string[]) =>
  `IdempotencyModule refuses to start: these handlers would run unprotected or answer duplicates wrongly:\n  - ${problems.join('\n  - ')}`;

export const gatewayUnsupported = (decorator: string, where: string) =>
  `${decorator} on ${where}: WebSocket gateways are not supported (a socket message has no redelivery to answer); call IdempotencyService.run() from the handler`;

export const resolverUnsupported = (decorator: string, where: string) =>
  `${decorator} on ${where}: GraphQL resolvers are not supported; call IdempotencyService.run() from the resolver`;

export const webhookOffHandler = (where: string) =>
  `@IdempotentWebhook on ${where}: not a controller route or message handler, so no interceptor would run it; use @Idempotent on provider methods`;

export const methodOnHandler = (where: string) =>
  `@Idempotent on ${where}: a route or message handler; use @IdempotentWebhook, which answers duplicates in flight with 409/503 + Retry-After`;

export const unknownOption = (name: string, suggestion: string | undefined) =>
  `IdempotencyModule has no option ${name}${suggestion ? `; did you mean ${suggestion}?` : ''}`;

export const eventKeyRejected = (reason: string) =>
  `${reason}; the event was acknowledged without running its handler (a redelivery would be refused the same way)`;

export const claimOptionType = (option: string, expected: string) => `${option} must be ${expected}`;

export const claimModeUnknown = (modes: readonly string[], got: unknown) =>
  `mode must be one of ${modes.map((name) => `'${name}'`).join(', ')}, got ${String(got)}`;

export const claimModeContradicted = (external: boolean, mode: string) =>
  `external: ${external} contradicts mode: '${mode}'; give one of them`;

export const claimLeaseOutOfRange = (got: unknown, max: number) =>
  typeof got === 'number' && got > max
    ? `leaseMs must be at most ${max} ms (about 24.8 days, the longest timer Node can set), got ${got}`
    : `leaseMs must be a positive number of milliseconds, got ${String(got)}`;

export const externalOnlyOptions = () =>
  `leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them`;

export const notAMethod = (where: string) => `@Idempotent on ${where}: not a method`;

export const optionNotPositive = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be a positive number, got ${String(value)}`;

export const optionNotNonNegative = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be zero or more, got ${String(value)}`;

export const optionTooLarge = (name: string, value: number, max: number) =>
  `IdempotencyModule option ${name} must be at most ${max} ms (the longest timer Node can set), got ${value}`;

export const optionNotWhole = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be a whole number (at most 2^53 - 1), got ${String(value)}`;

export const optionNotOneOf = (name: string, allowed: readonly unknown[], value: unknown) =>
  `IdempotencyModule option ${name} must be ${allowed.join(' or ')}, got ${String(value)}`;

export const headerMissing = (header: string) => `${header} header is missing`;

export const headerEmpty = (header: string) => `${header} header is empty`;

export const headerRepeated = (header: string) => `${header} header is sent more than once`;

export const headerMalformed = (header: string, expected: string) =>
  `${header} header is malformed: expected ${expected}`;

export const signatureMismatch = (header: string, signed: string, detail?: string) =>
  `${header} does not match ${signed}; was it signed with another secret, or the body changed on the way?${detail ? ` (${detail})` : ''}`;

export const signatureTooOld = (header: string, ageSeconds: number, toleranceSeconds: number) =>
  `${header} is ${ageSeconds} s old, more than the tolerance of ${toleranceSeconds} s: refused as a possible replay`;

export const signatureTooNew = (header: string, aheadSeconds: number, toleranceSeconds: number) =>
  `${header} is ${aheadSeconds} s in the future, more than the tolerance of ${toleranceSeconds} s: check the server's clock`;

export const rawBodyNotKept = (header: string, contentType: string | undefined) =>
  `Cannot verify ${header}: the request has no raw body to check (Content-Type ${contentType ?? 'none'}); Nest keeps the raw bytes of application/json and application/x-www-form-urlencoded bodies only`;

export const rawBodyDisabled = (header: string) =>
  `Cannot verify ${header}: request.rawBody is not set. Create the app with rawBody: true (NestFactory.create(AppModule, { rawBody: true })); with bodyParser: false, set request.rawBody to the body's bytes in your own parser`;

export const signatureSecretUnset = (guard: string, option: string) =>
  `${guard} has no secret to verify with: set IdempotencyModule option signatures.${option}.secret`;

export const signatureGuardNotHttp = (guard: string, type: string) =>
  `${guard} verifies HTTP webhook deliveries; it cannot check a '${type}' execution context`;

export const badSignatureOption = (path: string, detail: string) =>
  `IdempotencyModule option ${path} ${detail}`;

export const unknownSignatureName = (value: unknown, known: readonly string[]) =>
  `@IdempotentWebhook option signature must be one of ${known.map((name) => `'${name}'`).join(', ')}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

export const signatureGuardsRefused = (problems: string[]) =>
  `IdempotencyModule refuses to start: these webhook routes could not verify their signatures:\n  - ${problems.join('\n  - ')}`;

export const signatureSecretMissing = (where: string, guard: string, option: string) =>
  `${where} is guarded by ${guard}, but IdempotencyModule option signatures.${option}.secret is not set`;

export const rawBodyNotEnabled = (where: string, guard: string) =>
  `${where} is guarded by ${guard}, which verifies the raw request body, but the app was created without rawBody: true: create it with NestFactory.create(AppModule, { rawBody: true }) (in tests, createNestApplication({ rawBody: true }))`;

export const stripeNotInstalled = (where: string, error: unknown) =>
  `${where} is guarded by StripeSignatureGuard, which verifies with the stripe SDK, but it could not be loaded (${describe(error)}): npm install stripe`;

export const signatureGuardOnMessageHandler = (where: string, guard: string) =>
  `${guard} on ${where}: a message handler; signature guards verify HTTP webhook deliveries (a broker message carries no sender signature headers)`;

export const claimUnsettled = (scope: string, key: string) =>
  `The claim of ${scope} key ${key} found a row that changed under it on every read; retry later`;

export const failureNotRecorded = (scope: string, key: string, error: unknown) =>
  `Could not record the failure of ${scope} key ${key} (${describe(error)}); the next delivery runs it again all the same`;

export const badTableOption = (option: string, value: unknown, expected: string) =>
  `IdempotencyModule option ${option} must be ${expected}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

export const claimTableMissing = (table: string) =>
  `IdempotencyModule cannot start: the claims table ${table} does not exist. Run the library's migrations (migrations: [...IDEMPOTENCY_MIGRATIONS], or processedEventsMigrations({ schema, table }) for a table of your own), or check the schema and table options`;

export const claimTableMismatch = (table: string, problems: string[]) =>
  `IdempotencyModule cannot start: the claims table ${table} is not the one its migrations create (${problems.join('; ')}). Run the library's migrations, or point the schema and table options at the right table`;

export const unfinishedIndexMissing = (table: string) =>
  `The claims table ${table} has no index on unfinished claims: the reporter's poison query reads the whole table. Run the library's migrations (IDEMPOTENCY_MIGRATIONS adds it)`;

export const failedIndexMissing = (table: string) =>
  `The claims table ${table} has no index on failed claims: retention walks every unfinished claim to find the old failed ones. Run the library's migrations (IDEMPOTENCY_MIGRATIONS adds it)`;

export const abandonedClaimRemoved = (
  scope: string,
  key: string,
  status: string,
  attempts: number,
  days: number,
) =>
  `retention removed ${scope} key ${key}: ${status === 'failed' ? 'failed' : 'a dead lease'} after ${attempts} attempts, ${status === 'failed' ? 'last claimed' : 'its lease over'} more than ${days} days ago; its event will not be retried`;

export const moreAbandonedClaims = (count: number) => `... and ${count} more abandoned claims removed`;

/** `last_error` of a claim an operator released. */
export const releasedByOperator = () => 'released by an operator; the next delivery claims it again';

export const claimReleased = (scope: string, key: string, attempts: number, leaseWasLive: boolean) =>
  `released ${scope} key ${key} (attempt ${attempts}): ${
    leaseWasLive
      ? 'its lease was still live; if its worker is still running, its completion will be refused (lease_lost) and its side effect may run twice'
      : 'its lease had expired'
  }; the next delivery claims it again (attempt ${attempts + 1})`;

export const claimForgotten = (scope: string, key: string, status: string, attempts: number) =>
  `forgot ${scope} key ${key} (${status} after ${attempts} ${attempts === 1 ? 'attempt' : 'attempts'}); its next delivery runs the handler again (attempt 1)`;

export const claimNotFound = (scope: string, key: string) =>
  `no claim of ${scope} key ${key} (a transaction-mode delivery still running is not visible until it commits)`;

export const releaseOfDone = (scope: string, key: string) =>
  `${scope} key ${key} is done: there is no lease to release. To process the event again, forget it (force: true, or claims forget --force)`;

export const releaseOfFailed = (scope: string, key: string) =>
  `${scope} key ${key} holds no lease: its last attempt failed, and its next delivery claims it already`;

export const forgetOfLiveLease = (scope: string, key: string, leaseLeftMs: number | null) =>
  `${scope} key ${key} is being processed: its lease has ${
    leaseLeftMs === null ? 'no expiry' : `${Math.ceil(leaseLeftMs / 1000)} s left`
  }. If its worker is stuck or dead, release it first`;

export const forgetNeedsForce = (scope: string, key: string, status: string) =>
  `forgetting ${scope} key ${key} (${status}) makes its next delivery run the handler again: pass force: true (claims forget --force) to confirm`;

export const claimLocked = (scope: string, key: string) =>
  `${scope} key ${key} is held by a delivery running it in a transaction right now; try again once it finishes`;

export const claimActionRefused = (action: string, message: string) => `${action} refused: ${message}`;

export const badListOption = (option: string, value: unknown, expected: string) =>
  `IdempotencyClaims.list option ${option} must be ${expected}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

export const cliUsage = () => `Usage: nest-idempotent-webhooks claims <command> [options]

Commands:
  claims list [--status <status>] [--scope <scope>] [--older-than <age>] [--limit <n>] [--json]
      Claims, most recently claimed first. <status>: in_progress (a live lease), expired (a lease
      that ran out), failed, poison (not done after --max-attempts attempts), done.
      <age>: a number and a unit, ms s m h d (10m, 2h). --limit defaults to 100.
  claims show <scope> <key> [--json]
      One claim.
  claims release <scope> <key> [--json]
      Takes an in-progress lease away from its holder: the next delivery claims it at once.
  claims forget <scope> <key> --force [--json]
      Deletes a done, failed or expired claim: the next delivery runs the handler again.

Options of every command:
  --schema <schema>        the module's schema option (default: the connection's search_path)
  --table <table>          the module's table option (default: processed_events)
  --max-attempts <n>       the module's maxAttempts option, for poison (default: 5)
  --json                   JSON on stdout instead of text
  -h, --help               this text

Environment: DATABASE_URL, the PostgreSQL connection string of the app's database.
Exit codes: 0 done, 1 refused (nothing changed, or no such claim), 2 usage error, 3 database error.`;

export const cliUsageError = (detail: string) =>
  `${detail}\nRun nest-idempotent-webhooks claims --help for usage.`;

export const cliDatabaseUrlMissing = () =>
  'DATABASE_URL is not set: give the PostgreSQL connection string of the app database in it';

export const cliDatabaseFailed = (command: string, error: unknown) =>
  `claims ${command} failed: ${describe(error)}`;

export const cliTableMissing = (table: string) =>
  `the claims table ${table} does not exist in this database: check DATABASE_URL, and give --schema and --table as the module's schema and table options`;

export const keyTooManyBytes = (scope: string, keyBytes: number, scopeBytes: number, max: number) =>
  `Idempotency key of ${scope} is ${keyBytes} bytes in UTF-8; with its scope's ${scopeBytes} that is more than the ${max} bytes PostgreSQL's index on the claims table can hold`;

// Handoff to a worker (pg-boss): lib/transports/queue/.

export const claimTransactionOver = () =>
  `The claim transaction is over: SQL through the delivery's executor (and IdempotencyContext.enqueue()) must run inside the handler, before it returns`;

export const badHandoffOption = (path: string, detail: string) =>
  `IdempotencyModule option ${path} ${detail}`;

export const pgBossMissing = (error: unknown) =>
  `IdempotencyModule option handoff needs pg-boss, an optional peer dependency (npm install pg-boss@^10.4): ${describe(error)}`;

export const handoffNotConfigured = (what: string) =>
  `${what} needs IdempotencyModule's handoff option (handoff: { queues: { name: {} } }) and pg-boss installed`;

export const enqueueNeedsTransaction = (scope: string) =>
  `${scope} called IdempotencyContext.enqueue() without a claim transaction (external mode, or a delivery made by a test helper): a job is written in the claim's transaction, so that both commit or neither does; hand off from a transaction-mode handler`;

export const enqueueBadQueue = (value: unknown) =>
  `IdempotencyContext.enqueue() needs a queue name (a non-empty string), got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

export const enqueueBadOption = (option: string, expected: string, value: unknown) =>
  `IdempotencyContext.enqueue() option ${option} must be ${expected}, got ${String(value)}`;

export const queueMissing = (queue: string) =>
  `No job was written to queue ${queue}: pg-boss has no such queue. List it in handoff.queues (or name it in an @IdempotentWorker) so that IdempotencyModule creates it at boot`;

export const handoffNotStarted = (queue: string) =>
  `No job was written to queue ${queue}: the handoff has not started yet (the application is still booting); the delivery rolls back and the sender retries`;

export const workerOnController = (where: string) =>
  `@IdempotentWorker on ${where}: a controller; workers are provider methods, called with each job`;

export const workerNotStatic = (where: string, token: string) =>
  `@IdempotentWorker on ${where}: the provider ${token} is request-scoped or transient, so there is no one instance to run its jobs; make it a singleton`;

export const workersWithoutHandoff = (where: string[]) =>
  `IdempotencyModule refuses to start: @IdempotentWorker on ${where.join(', ')} needs the handoff option (handoff: { queues: { ... } }), or its jobs would never run`;

export const jobNotHandedOff = (queue: string, id: string) =>
  `Job ${id} of queue ${queue} carries no event key (it was not enqueued through IdempotencyContext.enqueue()): failed without running`;

export const jobFailed = (
  queue: string,
  id: string,
  key: string,
  attempt: number,
  retrying: boolean,
  error: unknown,
) =>
  `Job ${id} of queue ${queue} (event ${key}) failed on attempt ${attempt}: ${describe(error)}; ${retrying ? 'pg-boss retries it after its backoff' : 'no retries left, it goes to the dead-letter queue'}`;

export const jobInFlight = (queue: string, key: string) =>
  `Event ${key} of queue ${queue} is being processed by another worker; its job is retried after its backoff`;

export const jobSettleFailed = (queue: string, id: string, what: string, error: unknown) =>
  `Could not mark job ${id} of queue ${queue} ${what}: ${describe(error)}; pg-boss hands it out again once it expires, and its claim answers it without running it twice`;

export const drainTimedOut = (count: number, drainMs: number) =>
  `Shutdown: ${count} job(s) still running after handoff.drainMs (${drainMs} ms) were left for pg-boss to hand out again once they expire`;

export const deadLetteredJob = (queue: string, deadLetter: string, key: string, lastError: string | null) =>
  `dead-lettered job: queue ${queue} event ${key} ran out of retries and waits in ${deadLetter}${lastError ? `; last error: ${lastError}` : ''}`;

export const moreDeadLetteredJobs = (count: number) => `... and ${count} more dead-lettered jobs`;

export const pgBossFailed = (error: unknown) => `pg-boss: ${describe(error)}`;

export const pgBossInstallRaced = (schema: string, error: unknown) =>
  `pg-boss: another instance was installing schema ${schema} at the same moment (${describe(error)}); starting again`;

export const queueCreationRaced = (queue: string, error: unknown) =>
  `pg-boss: another instance was creating queue ${queue} at the same moment (${describe(error)}); creating it again`;

export const workerAlsoIdempotent = (where: string) =>
  `@IdempotentWorker on ${where}: the method also carries @Idempotent or @IdempotentWebhook; the worker already runs each job under a claim, so keep one decorator`;

export const workerBadQueue = (value: unknown) =>
  `@IdempotentWorker needs a queue name (1 to 100 letters, digits, and _ . - /), got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

export const statementNotInlinable = (what: string) =>
  `A statement sent with the COMMIT has its values inlined, and this one has ${what}; send it with executeSql() instead`;

export const parameterNotInlinable = (type: string) =>
  `A statement sent with the COMMIT has its values inlined as literals; a value of type ${type === 'object' ? 'array or Buffer' : type} cannot be; send it with executeSql() instead`;

export const pgBossSendChanged = (statements: number, returned: unknown, id: string) =>
  `pg-boss's send() did not write one job as pg-boss 10 does (${statements} statements, id ${String(returned)} for ${id}): this pg-boss is not one the handoff supports (^10.4)`;
