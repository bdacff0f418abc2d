-- +goose Up

-- The checkout's optional return_url (CONTRACT.md, (v3) Clients): where
-- Stripe sends the customer back after a 3D Secure redirect. It is sent with
-- every confirm of the order's PaymentIntent, also by the completer and the
-- reconciler long after the request that carried it, so it is stored with
-- the order rather than only in the key's request body. NULL: no redirect
-- (next_action use_stripe_sdk, for Stripe.js). Adding a nullable column
-- without a default rewrites nothing and takes its lock only for an instant.
ALTER TABLE orders ADD COLUMN return_url text;

-- +goose Down
ALTER TABLE orders DROP COLUMN return_url;
