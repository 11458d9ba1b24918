/**
 * What the outside-write check knows of PostgreSQL's parse nodes and functions, by name: the
 * statement kinds that change nothing, the DML nodes, the names each kind is reported by, and
 * the functions known to read only. Data, no logic: the
 * classifier (statement.classifier.ts) walks the tree and looks its nodes up here.
 */

/** The statements that change nothing: what the node says is all they do. */
export const SESSION_COMMANDS: Record<string, string> = {
  TransactionStmt: 'is a transaction command (BEGIN, COMMIT, SAVEPOINT...), no write of its own',
  VariableSetStmt: 'sets a setting of the session (SET), not a write',
  VariableShowStmt: 'reads a setting (SHOW)',
  DiscardStmt: "resets the session's state (DISCARD), not a write",
  ListenStmt: 'listens for notifications (LISTEN), not a write',
  UnlistenStmt: 'stops listening (UNLISTEN), not a write',
  LockStmt: 'takes a lock (LOCK TABLE), not a write',
  DeallocateStmt: 'drops a prepared statement (DEALLOCATE), not a write',
  ClosePortalStmt: 'closes a cursor (CLOSE), not a write',
  FetchStmt: 'reads from a cursor (FETCH)',
  CheckPointStmt: 'asks for a checkpoint (CHECKPOINT), no write of the data',
  ConstraintsSetStmt: 'sets when constraints are checked (SET CONSTRAINTS), not a write',
};

/** The data-modifying statements, wherever they sit (top level, a WITH, COPY's or EXPLAIN's query). */
export const DML: Record<string, string> = {
  InsertStmt: 'INSERT',
  UpdateStmt: 'UPDATE',
  DeleteStmt: 'DELETE',
  MergeStmt: 'MERGE',
};

/** SQL's names for the node types that are not DML and not named by splitting theirs. */
export const KINDS: Record<string, string> = {
  SelectStmt: 'SELECT',
  CopyStmt: 'COPY',
  TruncateStmt: 'TRUNCATE',
  CallStmt: 'CALL',
  DoStmt: 'DO',
  ExecuteStmt: 'EXECUTE',
  ExplainStmt: 'EXPLAIN',
  PrepareStmt: 'PREPARE',
  NotifyStmt: 'NOTIFY',
  CreateTableAsStmt: 'CREATE TABLE AS',
  DeclareCursorStmt: 'DECLARE CURSOR',
  CreateStmt: 'CREATE TABLE',
  IndexStmt: 'CREATE INDEX',
  ViewStmt: 'CREATE VIEW',
  CreateFunctionStmt: 'CREATE FUNCTION',
  DropStmt: 'DROP',
  RenameStmt: 'ALTER ... RENAME',
  TransactionStmt: 'a transaction command',
  VariableSetStmt: 'SET',
  VariableShowStmt: 'SHOW',
  LockStmt: 'LOCK',
  ...DML,
};

/**
 * Built-in functions without side effects (PostgreSQL's catalog, unqualified or `pg_catalog.`),
 * immutable or stable, the ones reads commonly call: a small list on purpose, since a function
 * not in it is undecided, never guessed. An app's function of one of these names in another
 * schema, called unqualified, is taken for the built-in one: PostgreSQL searches pg_catalog first.
 * test/e2e/statement-classifier.e2e-spec.ts checks each against pg_proc.
 */
export const READ_ONLY_FUNCTIONS: ReadonlySet<string> = new Set([
  // aggregates and window functions
  ...['count', 'sum', 'avg', 'min', 'max', 'array_agg', 'string_agg', 'json_agg', 'jsonb_agg'],
  ...['json_object_agg', 'jsonb_object_agg', 'bool_and', 'bool_or', 'every', 'stddev', 'variance'],
  ...['percentile_cont', 'percentile_disc', 'mode', 'row_number', 'rank', 'dense_rank', 'ntile'],
  ...['percent_rank', 'cume_dist', 'lag', 'lead', 'first_value', 'last_value', 'nth_value'],
  // strings
  ...['lower', 'upper', 'length', 'char_length', 'octet_length', 'concat', 'concat_ws', 'format'],
  ...['substring', 'substr', 'left', 'right', 'btrim', 'ltrim', 'rtrim', 'replace', 'split_part'],
  ...['position', 'strpos', 'lpad', 'rpad', 'md5', 'sha256', 'encode', 'decode', 'regexp_replace'],
  ...['regexp_match', 'regexp_matches', 'starts_with', 'initcap', 'repeat', 'reverse', 'translate'],
  ...['quote_ident', 'quote_literal', 'string_to_array', 'array_to_string', 'to_char', 'to_number'],
  // numbers, dates, times
  ...['abs', 'round', 'floor', 'ceil', 'ceiling', 'trunc', 'mod', 'power', 'sqrt', 'now'],
  ...['date_trunc', 'date_part', 'extract', 'age', 'make_date', 'make_interval', 'timezone'],
  ...['to_date', 'to_timestamp', 'statement_timestamp', 'transaction_timestamp'],
  // json and arrays
  ...['to_json', 'to_jsonb', 'row_to_json', 'json_build_object', 'jsonb_build_object', 'jsonb_set'],
  ...['json_build_array', 'jsonb_build_array', 'json_array_elements', 'jsonb_array_elements'],
  ...['json_each', 'jsonb_each', 'json_array_length', 'jsonb_array_length', 'jsonb_typeof'],
  ...['json_extract_path', 'jsonb_extract_path', 'json_extract_path_text', 'jsonb_extract_path_text'],
  ...['jsonb_strip_nulls', 'array_length', 'cardinality', 'unnest', 'array_position', 'array_append'],
  ...['array_remove', 'generate_series', 'generate_subscripts'],
  // the session and the catalog, as TypeORM and health checks read them
  ...['version', 'current_database', 'current_schema', 'current_schemas', 'current_setting'],
  ...['pg_backend_pid', 'pg_typeof', 'format_type', 'to_regclass', 'pg_get_expr', 'obj_description'],
  ...['col_description', 'pg_get_serial_sequence', 'pg_table_is_visible', 'has_table_privilege'],
]);

/**
 * Built-ins PostgreSQL marks volatile (each call may answer differently) that change nothing:
 * they read a clock, a random source or the session's last sequence value.
 */
export const VOLATILE_READ_ONLY_FUNCTIONS: ReadonlySet<string> = new Set([
  ...['random', 'gen_random_uuid', 'clock_timestamp', 'timeofday', 'currval', 'lastval'],
]);

/**
 * Sequence functions: they change the sequence, but no rollback undoes that on any connection, so
 * the claim's transaction could not hold them back either. Not a write of the kind the check is for.
 */
export const SEQUENCE_FUNCTIONS = new Set(['nextval', 'setval']);
