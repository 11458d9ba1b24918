/**
 * What a typed handler decorator (`@IdempotentWebhook<Event>`, `@IdempotentRequest<Request, Body>`,
 * `@IdempotentWorker<Data>`) checks on the method it decorates: its first parameter takes `First`.
 * Only `value`, not a `TypedPropertyDescriptor`: its `set` would make the check two-way, and a
 * handler that takes no parameter at all (it needs nothing of the event) would fail to compile.
 * @typeParam First - what the handler's first parameter must accept; `any` (the default) checks nothing
 */
export interface HandlerDescriptor<First = any> {
  value?: (first: First, ...rest: any[]) => any;
}

/**
 * The decorator `@IdempotentWebhook`, `@IdempotentRequest` and `@IdempotentWorker` return. The
 * descriptor is optional so that it is a `PropertyDecorator` too, the type Nest's
 * `applyDecorators()` takes a decorator without a descriptor as: a decorator of your own composed
 * of it still compiles (its use on a property, with no method, fails at import).
 * @typeParam First - what the decorated method's first parameter must accept
 */
export type HandlerDecorator<First = any> = (
  target: object,
  propertyKey: string | symbol,
  descriptor?: HandlerDescriptor<First>,
) => void;
