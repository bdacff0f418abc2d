-- +goose Up

-- Stock in buckets. Every checkout of a sku used to update that product's
-- one row, so checkouts of a hot sku (a flash sale) queued on its lock from
-- their reservation to their commit. A sku's stock is now split over 16
-- rows; a checkout takes its units from one bucket nobody else holds (FOR
-- UPDATE SKIP LOCKED), so up to 16 checkouts of one sku commit at once. The
-- stock is still exact: each bucket is CHECK (stock >= 0), and a quantity
-- no single bucket holds is taken from several with all of them locked.
ALTER TABLE products RENAME TO product_catalog;

CREATE TABLE stock_buckets (
    sku    text     NOT NULL REFERENCES product_catalog (sku) ON DELETE CASCADE,
    bucket smallint NOT NULL,
    stock  bigint   NOT NULL CHECK (stock >= 0),
    PRIMARY KEY (sku, bucket)
);

INSERT INTO stock_buckets (sku, bucket, stock)
SELECT sku, b, stock / 16 + CASE WHEN b < stock % 16 THEN 1 ELSE 0 END
FROM product_catalog, generate_series(0, 15) AS b;

ALTER TABLE product_catalog DROP COLUMN stock;

-- products is what it always was to a reader: the catalog with each sku's
-- total stock. Writes to it (INSERT a product, UPDATE its stock, DELETE)
-- go to the catalog and the buckets.
CREATE VIEW products AS
SELECT c.sku, c.name, c.unit_amount, c.currency,
       COALESCE((SELECT sum(b.stock) FROM stock_buckets b WHERE b.sku = c.sku), 0)::bigint AS stock
FROM product_catalog c;

-- set_stock makes sku's total stock total, spread evenly over 16 buckets,
-- with every bucket of the sku locked (in bucket order, like every path
-- that locks more than one).
-- +goose StatementBegin
CREATE FUNCTION set_stock(p_sku text, p_total bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_total < 0 THEN
        RAISE EXCEPTION 'stock of % cannot be negative', p_sku USING ERRCODE = 'check_violation';
    END IF;
    PERFORM 1 FROM stock_buckets WHERE sku = p_sku ORDER BY bucket FOR UPDATE;
    INSERT INTO stock_buckets (sku, bucket, stock)
    SELECT p_sku, b, p_total / 16 + CASE WHEN b < p_total % 16 THEN 1 ELSE 0 END
    FROM generate_series(0, 15) AS b
    ON CONFLICT (sku, bucket) DO UPDATE SET stock = excluded.stock;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION products_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO product_catalog (sku, name, unit_amount, currency)
        VALUES (NEW.sku, NEW.name, NEW.unit_amount, NEW.currency);
        PERFORM set_stock(NEW.sku, COALESCE(NEW.stock, 0));
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.sku IS DISTINCT FROM OLD.sku THEN
            RAISE EXCEPTION 'a product''s sku cannot change' USING ERRCODE = 'feature_not_supported';
        END IF;
        UPDATE product_catalog SET name = NEW.name, unit_amount = NEW.unit_amount, currency = NEW.currency
        WHERE sku = OLD.sku;
        IF NEW.stock IS DISTINCT FROM OLD.stock THEN
            PERFORM set_stock(OLD.sku, NEW.stock);
        END IF;
        RETURN NEW;
    END IF;
    DELETE FROM product_catalog WHERE sku = OLD.sku;
    RETURN OLD;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER products_write INSTEAD OF INSERT OR UPDATE OR DELETE ON products
FOR EACH ROW EXECUTE FUNCTION products_write();

-- reserve_one takes qty units of sku, or reports false having taken none.
-- +goose StatementBegin
CREATE FUNCTION reserve_one(p_sku text, p_qty bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    b     smallint;
    r     record;
    total bigint := 0;
    need  bigint;
BEGIN
    -- 1. A bucket that covers the quantity and that no transaction in
    -- flight holds: taken without waiting.
    UPDATE stock_buckets SET stock = stock - p_qty
    WHERE sku = p_sku AND bucket = (
        SELECT bucket FROM stock_buckets
        WHERE sku = p_sku AND stock >= p_qty
        ORDER BY bucket LIMIT 1
        FOR UPDATE SKIP LOCKED)
    RETURNING bucket INTO b;
    IF FOUND THEN
        RETURN true;
    END IF;

    -- 2. Every such bucket is held by a checkout in flight: wait for one of
    -- them (a random one, so waiters spread), and take it if it still
    -- covers the quantity once its holder commits. The block is a
    -- subtransaction: when the bucket no longer covers the quantity, the
    -- lock taken while waiting is given back before step 3 locks in order.
    SELECT bucket INTO b FROM stock_buckets
    WHERE sku = p_sku AND stock >= p_qty ORDER BY random() LIMIT 1;
    IF FOUND THEN
        BEGIN
            UPDATE stock_buckets SET stock = stock - p_qty
            WHERE sku = p_sku AND bucket = b AND stock >= p_qty;
            IF FOUND THEN
                RETURN true;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'CKB01';
        EXCEPTION WHEN SQLSTATE 'CKB01' THEN
            NULL;
        END;
    END IF;

    -- 3. No bucket covers the quantity alone: lock them all, in bucket
    -- order, and take it from several if together they hold enough.
    FOR r IN SELECT stock FROM stock_buckets WHERE sku = p_sku ORDER BY bucket FOR UPDATE LOOP
        total := total + r.stock;
    END LOOP;
    IF total < p_qty THEN
        RETURN false;
    END IF;
    need := p_qty;
    FOR r IN SELECT bucket, stock FROM stock_buckets WHERE sku = p_sku AND stock > 0 ORDER BY stock DESC, bucket LOOP
        UPDATE stock_buckets SET stock = stock - least(need, r.stock) WHERE sku = p_sku AND bucket = r.bucket;
        need := need - least(need, r.stock);
        EXIT WHEN need = 0;
    END LOOP;
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- reserve_stock takes p_qtys[i] units of each p_skus[i] (the caller sorts
-- the skus, so that transactions lock buckets of several skus in one
-- order), all or nothing: false when any sku is short, having taken none.
-- +goose StatementBegin
CREATE FUNCTION reserve_stock(p_skus text[], p_qtys bigint[]) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_skus) = 1 THEN
        RETURN reserve_one(p_skus[1], p_qtys[1]);
    END IF;
    -- A subtransaction: a short sku undoes the skus reserved before it.
    BEGIN
        FOR i IN 1 .. cardinality(p_skus) LOOP
            IF NOT reserve_one(p_skus[i], p_qtys[i]) THEN
                RAISE EXCEPTION USING ERRCODE = 'CKB02';
            END IF;
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'CKB02' THEN
        RETURN false;
    END;
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- release_stock gives p_qtys[i] units of each p_skus[i] back, to a bucket
-- nobody holds if there is one.
-- +goose StatementBegin
CREATE FUNCTION release_stock(p_skus text[], p_qtys bigint[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. cardinality(p_skus) LOOP
        UPDATE stock_buckets SET stock = stock + p_qtys[i]
        WHERE sku = p_skus[i] AND bucket = (
            SELECT bucket FROM stock_buckets WHERE sku = p_skus[i]
            ORDER BY bucket LIMIT 1 FOR UPDATE SKIP LOCKED);
        IF NOT FOUND THEN
            UPDATE stock_buckets SET stock = stock + p_qtys[i]
            WHERE sku = p_skus[i] AND bucket = (
                SELECT bucket FROM stock_buckets WHERE sku = p_skus[i] ORDER BY random() LIMIT 1);
        END IF;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'release stock: no buckets for sku %', p_skus[i];
        END IF;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- The relay no longer wakes on NOTIFY: at commit, NOTIFY takes a lock that
-- is global to the cluster (PreCommit_Notify), so every checkout commit
-- queued behind every other. The relay polls instead, adaptively (see
-- internal/outbox/relay.go).
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();

-- The relay claims the oldest due rows (ORDER BY seq LIMIT n FOR UPDATE
-- SKIP LOCKED). With the index on (next_attempt_at, seq) that meant reading
-- and sorting every due row for each batch: fine when the relay keeps up,
-- quadratic on a backlog. In seq order, a claim reads about the rows it
-- takes (and the ones other batches in flight hold).
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

-- +goose Down
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (next_attempt_at, seq) WHERE published_at IS NULL;
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
DROP FUNCTION release_stock(text[], bigint[]);
DROP FUNCTION reserve_stock(text[], bigint[]);
DROP FUNCTION reserve_one(text, bigint);
DROP TRIGGER products_write ON products;
DROP FUNCTION products_write();
DROP FUNCTION set_stock(text, bigint);
DROP VIEW products;
ALTER TABLE product_catalog ADD COLUMN stock bigint NOT NULL DEFAULT 0 CHECK (stock >= 0);
UPDATE product_catalog c SET stock = (SELECT COALESCE(sum(stock), 0) FROM stock_buckets b WHERE b.sku = c.sku);
ALTER TABLE product_catalog ALTER COLUMN stock DROP DEFAULT;
DROP TABLE stock_buckets;
ALTER TABLE product_catalog RENAME TO products;
