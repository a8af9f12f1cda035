-- Partition repair (issue 8 item 5): what PostgreSQL does not stream for partitions of a root published
-- via the root (TRUNCATE of one partition, DETACH PARTITION, DROP of a partition, ATTACH of a table that
-- holds rows) is emitted into the WAL, at the operation's exact position and inside its transaction, as
-- transactional logical messages with prefix 'tidewater.rows' (see upstream/postgres/partition_messages.py
-- for the format): the keys of the rows that left the root (deleted downstream) and the rows that joined it
-- (upserted downstream). The puller turns them into ordinary row changes of the root.
--
-- Objects (all in schema tidewater, installed by upstream/postgres/capture_objects.py, idempotent):
--   partitions_roots()                    published partitioned roots (publications tidewater_pub_*)
--   partitions_members()                  (root, leaf) of every leaf of those roots
--   partitions_emit(root, leaf, op, why)  the rows of one leaf as messages: op 'delete' (keys) or 'upsert'
--   partitions_lost(root, leaf, why)      a marker saying rows could not be emitted (-> divergence warning)
--   partitions_sync()                     a BEFORE TRUNCATE trigger on every leaf, BEFORE/AFTER on roots
--   partitions_on_truncate()              trigger: a truncated leaf's keys as deletes, unless its root is
--                                         being truncated in the same statement (that one is streamed)
--   event triggers tidewater_partitions_start / _end: membership before and after each DDL; leaves that
--   left are emitted as deletes, leaves that joined as upserts; a DROP's candidates are emitted as deletes
--   before the DROP runs (afterwards their rows are gone) and re-emitted as upserts if they survived.
-- Nothing here may make the user's statement fail: every catalog read is in an EXCEPTION block whose failure
-- emits a 'lost' marker instead (the changefeed shows `warning`). Messages are never emitted inside such a
-- block: PostgreSQL 18.6 decodes a message of a subtransaction after the rest of the transaction, i.e.
-- after rows written later than it (tests/integration/test_partition_messages.py shows the order).

CREATE OR REPLACE FUNCTION tidewater.partitions_roots() RETURNS SETOF oid
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT pr.prrelid
    FROM pg_publication_rel pr
    JOIN pg_publication p ON p.oid = pr.prpubid
    JOIN pg_class c ON c.oid = pr.prrelid
    WHERE p.pubname LIKE 'tidewater\_pub\_%' AND c.relkind = 'p'
$$;

CREATE OR REPLACE FUNCTION tidewater.partitions_members(OUT root oid, OUT leaf oid) RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT r, t.relid::oid
    FROM tidewater.partitions_roots() r, pg_partition_tree(r) t
    WHERE t.isleaf AND t.level > 0
$$;

-- The columns pgoutput sends for ``root`` (attnum order; stored generated ones from PostgreSQL 18, as
-- Tidewater's publications publish them) and which of them identify a row in a DELETE.
CREATE OR REPLACE FUNCTION tidewater.partitions_columns(root oid)
RETURNS TABLE(name text, type_oid oid, typmod int, is_key boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.attname::text, a.atttypid, a.atttypmod,
           CASE WHEN c.relreplident = 'f' THEN true
                ELSE EXISTS (SELECT 1 FROM pg_index i
                             WHERE i.indrelid = c.oid
                               AND (CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END)
                               AND a.attnum = ANY (i.indkey))
           END
    FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
    WHERE c.oid = root AND a.attnum > 0 AND NOT a.attisdropped
      AND (a.attgenerated = '' OR (a.attgenerated = 's' AND current_setting('server_version_num')::int >= 180000))
    ORDER BY a.attnum
$$;

CREATE OR REPLACE FUNCTION tidewater.partitions_lost(root oid, leaf oid, leaf_name text, why text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'tidewater.rows', json_build_object(
        'v', 1, 'op', 'lost', 'root_oid', root,
        'root', json_build_array((SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                  WHERE c.oid = root),
                                 (SELECT relname FROM pg_class WHERE oid = root)),
        'leaf', leaf_name, 'leaf_oid', leaf, 'reason', why)::text);
END
$$;

-- The rows of ``leaf`` as messages for ``root``: 'delete' sends the identifying columns, 'upsert' all of
-- them, each value as its type's text output under the session settings of Tidewater's stream (below), so
-- that it parses exactly like a value pgoutput sends. 5,000 rows per message.
CREATE OR REPLACE FUNCTION tidewater.partitions_emit(root oid, leaf oid, op text, why text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET timezone = 'UTC' SET datestyle = 'ISO' SET intervalstyle = 'postgres'
SET extra_float_digits = 3 SET bytea_output = 'hex' AS $$
DECLARE
    cols json;
    sel text;
    head text;
    chunk json;
    total bigint := 0;
    cnt int;
BEGIN
    SELECT json_agg(json_build_array(name, type_oid, typmod, is_key)),
           string_agg(format('%I::text', name), ', ') FILTER (WHERE op = 'upsert' OR is_key)
      INTO cols, sel
      FROM tidewater.partitions_columns(root);
    IF sel IS NULL THEN
        PERFORM tidewater.partitions_lost(root, leaf, leaf::regclass::text, why || ': the root has no replica identity');
        RETURN 0;
    END IF;
    head := json_build_object(
        'v', 1, 'op', op, 'reason', why, 'root_oid', root,
        'root', (SELECT json_build_array(n.nspname, c.relname) FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = root),
        'replident', (SELECT relreplident FROM pg_class WHERE oid = root),
        'leaf', leaf::regclass::text, 'columns', cols)::text;
    FOR chunk, cnt IN EXECUTE format(
        'SELECT json_agg(json_build_array(%s)), count(*) FROM (SELECT *, (row_number() OVER () - 1) / 5000 AS tidewater_g '
        'FROM ONLY %s) s GROUP BY tidewater_g', sel, leaf::regclass)
    LOOP
        PERFORM pg_logical_emit_message(true, 'tidewater.rows',
            left(head, length(head) - 1) || ', "rows" : ' || chunk::text || '}');
        total := total + cnt;
    END LOOP;
    RETURN total;
END
$$;

-- A leaf's BEFORE TRUNCATE trigger. The roots' BEFORE TRUNCATE trigger marks the root as being truncated
-- (its TRUNCATE is streamed; PostgreSQL fires the BEFORE triggers of a root before those of its
-- partitions) and its AFTER trigger unmarks it, so only partitions truncated on their own emit keys.
CREATE OR REPLACE FUNCTION tidewater.partitions_on_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    marked text := coalesce(current_setting('tidewater.truncating_roots', true), '');
    root oid;
    failure text;
BEGIN
    IF TG_ARGV[0] = 'root' THEN
        IF TG_WHEN = 'BEFORE' THEN
            PERFORM set_config('tidewater.truncating_roots', marked || ',' || TG_RELID::text || ',', true);
        ELSE
            PERFORM set_config('tidewater.truncating_roots', replace(marked, ',' || TG_RELID::text || ',', ''), true);
        END IF;
        RETURN NULL;
    END IF;
    -- Messages are emitted outside EXCEPTION blocks: one emitted inside a subtransaction is decoded after the
    -- rest of its transaction (measured on PostgreSQL 18.6). The block only reads the catalog.
    BEGIN
        root := pg_partition_root(TG_RELID);
        IF root IS NULL OR root = TG_RELID OR position(',' || root::text || ',' IN marked) > 0
           OR root NOT IN (SELECT tidewater.partitions_roots()) THEN
            RETURN NULL;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        failure := SQLERRM;
    END;
    IF failure IS NOT NULL THEN
        PERFORM tidewater.partitions_lost(coalesce(root, 0), TG_RELID, TG_RELID::regclass::text, 'truncate: ' || failure);
    ELSE
        PERFORM tidewater.partitions_emit(root, TG_RELID, 'delete', 'truncate');
    END IF;
    RETURN NULL;
END
$$;

-- Make sure every leaf of a published root has the truncate trigger and every root the marking pair.
CREATE OR REPLACE FUNCTION tidewater.partitions_sync() RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rel oid;
    is_root boolean;
    made int := 0;
    internal text := current_setting('tidewater.internal', true);
BEGIN
    PERFORM set_config('tidewater.internal', 'on', true);
    FOR rel, is_root IN
        SELECT r, true FROM tidewater.partitions_roots() r
        UNION ALL SELECT m.leaf, false FROM tidewater.partitions_members() m
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = rel AND tgname = 'tidewater_partitions_truncate') THEN
            IF is_root THEN
                EXECUTE format('CREATE TRIGGER tidewater_partitions_truncate BEFORE TRUNCATE ON %s '
                               'FOR EACH STATEMENT EXECUTE FUNCTION tidewater.partitions_on_truncate(''root'')', rel::regclass);
                EXECUTE format('CREATE TRIGGER tidewater_partitions_truncate_after AFTER TRUNCATE ON %s '
                               'FOR EACH STATEMENT EXECUTE FUNCTION tidewater.partitions_on_truncate(''root'')', rel::regclass);
                EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER tidewater_partitions_truncate_after', rel::regclass);
            ELSE
                EXECUTE format('CREATE TRIGGER tidewater_partitions_truncate BEFORE TRUNCATE ON %s '
                               'FOR EACH STATEMENT EXECUTE FUNCTION tidewater.partitions_on_truncate(''leaf'')', rel::regclass);
            END IF;
            EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER tidewater_partitions_truncate', rel::regclass);
            made := made + 1;
        END IF;
    END LOOP;
    PERFORM set_config('tidewater.internal', coalesce(internal, ''), true);
    RETURN made;
END
$$;

CREATE OR REPLACE FUNCTION tidewater.partitions_ddl_start() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
    m record;
    candidates text := ',';
    pending oid[] := '{}';
    i int;
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    BEGIN  -- reads only (see partitions_on_truncate); the messages go out after it
        -- 'root:leaf' per leaf and 'root:0' per published root (so a root without partitions counts)
        PERFORM set_config('tidewater.partitions_before', coalesce((
            SELECT string_agg(x, ',') FROM (
                SELECT root::text || ':' || leaf::text AS x FROM tidewater.partitions_members()
                UNION ALL SELECT r::text || ':0' FROM tidewater.partitions_roots() r) s), ''), false);
        IF TG_TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED') THEN
            -- Once dropped, a partition's rows cannot be read: emit the keys of every partition the statement
            -- names (by table or schema name), before it runs. Those that survive are re-sent as upserts
            -- at ddl_command_end; a dropped partition that was not named is reported as lost.
            q := lower(current_query());
            FOR m IN SELECT mm.root, mm.leaf, c.relname, n.nspname FROM tidewater.partitions_members() mm
                     JOIN pg_class c ON c.oid = mm.leaf JOIN pg_namespace n ON n.oid = c.relnamespace
            LOOP
                IF position(lower(m.relname) IN q) > 0 OR position(lower(m.nspname) IN q) > 0 THEN
                    pending := pending || m.root || m.leaf;
                    candidates := candidates || m.leaf::text || ',';
                END IF;
            END LOOP;
        END IF;
        PERFORM set_config('tidewater.partitions_candidates', candidates, false);
    EXCEPTION WHEN OTHERS THEN
        PERFORM set_config('tidewater.partitions_before', 'error:' || SQLERRM, false);
        RETURN;
    END;
    FOR i IN 1 .. coalesce(array_length(pending, 1), 0) / 2 LOOP
        PERFORM tidewater.partitions_emit(pending[2 * i - 1], pending[2 * i], 'delete', 'drop');
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION tidewater.partitions_ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    before_text text := coalesce(current_setting('tidewater.partitions_before', true), '');
    candidates text := coalesce(current_setting('tidewater.partitions_candidates', true), ',');
    b record;
    a record;
    todo text[] := '{}';
    failure text;
    i int;
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    PERFORM set_config('tidewater.partitions_before', '', false);
    PERFORM set_config('tidewater.partitions_candidates', ',', false);
    BEGIN  -- reads only (see partitions_on_truncate): what to emit is collected, then emitted after it
        IF before_text LIKE 'error:%' THEN
            RAISE EXCEPTION '%', substr(before_text, 7);
        END IF;
        FOR b IN
            WITH before AS (
                SELECT split_part(x, ':', 1)::oid AS root, split_part(x, ':', 2)::oid AS leaf
                FROM unnest(string_to_array(nullif(before_text, ''), ',')) x
            ), now AS (SELECT * FROM tidewater.partitions_members())
            SELECT bf.root, bf.leaf,
                   EXISTS (SELECT 1 FROM pg_class WHERE oid = bf.leaf) AS leaf_exists,
                   position(',' || bf.leaf::text || ',' IN candidates) > 0 AS candidate,
                   EXISTS (SELECT 1 FROM now WHERE now.leaf = bf.leaf AND now.root = bf.root) AS still_member
            FROM before bf
            WHERE bf.leaf <> 0 AND bf.root IN (SELECT tidewater.partitions_roots())
        LOOP
            IF b.still_member THEN
                IF b.candidate THEN  -- named by a DROP that did not drop it: its keys were deleted, restore
                    todo := todo || ARRAY[b.root::text, b.leaf::text, 'upsert', 'restore'];
                END IF;
            ELSIF b.leaf_exists THEN
                IF NOT b.candidate THEN
                    todo := todo || ARRAY[b.root::text, b.leaf::text, 'delete', 'detach'];
                END IF;
            ELSIF NOT b.candidate THEN
                todo := todo || ARRAY[b.root::text, b.leaf::text, 'lost', 'dropped without being named'];
            END IF;
        END LOOP;
        FOR a IN
            SELECT now.root, now.leaf FROM tidewater.partitions_members() now
            WHERE now.root IN (SELECT split_part(x, ':', 1)::oid
                               FROM unnest(string_to_array(nullif(before_text, ''), ',')) x)
              AND NOT (now.root::text || ':' || now.leaf::text = ANY (string_to_array(before_text, ',')))
        LOOP
            todo := todo || ARRAY[a.root::text, a.leaf::text, 'upsert', 'attach'];
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        failure := TG_TAG || ': ' || SQLERRM;
    END;
    IF failure IS NOT NULL THEN
        PERFORM tidewater.partitions_lost(0, 0, '', failure);
        RETURN;
    END IF;
    FOR i IN 1 .. coalesce(array_length(todo, 1), 0) / 4 LOOP
        IF todo[4 * i - 1] = 'lost' THEN
            PERFORM tidewater.partitions_lost(todo[4 * i - 3]::oid, todo[4 * i - 2]::oid, todo[4 * i - 2], todo[4 * i]);
        ELSE
            PERFORM tidewater.partitions_emit(todo[4 * i - 3]::oid, todo[4 * i - 2]::oid, todo[4 * i - 1], todo[4 * i]);
        END IF;
    END LOOP;
    PERFORM tidewater.partitions_sync();
END
$$;

DROP EVENT TRIGGER IF EXISTS tidewater_partitions_start;
CREATE EVENT TRIGGER tidewater_partitions_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'DROP TABLE', 'DROP SCHEMA', 'DROP OWNED', 'CREATE TABLE', 'ALTER PUBLICATION',
                 'CREATE PUBLICATION')
    EXECUTE FUNCTION tidewater.partitions_ddl_start();
ALTER EVENT TRIGGER tidewater_partitions_start ENABLE ALWAYS;

DROP EVENT TRIGGER IF EXISTS tidewater_partitions_end;
CREATE EVENT TRIGGER tidewater_partitions_end ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'DROP TABLE', 'DROP SCHEMA', 'DROP OWNED', 'CREATE TABLE', 'ALTER PUBLICATION',
                 'CREATE PUBLICATION')
    EXECUTE FUNCTION tidewater.partitions_ddl_end();
ALTER EVENT TRIGGER tidewater_partitions_end ENABLE ALWAYS;

SELECT tidewater.partitions_sync();
