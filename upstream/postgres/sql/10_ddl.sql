-- DDL in the stream (issue 9): after every command that creates, alters or drops a table, a transactional
-- logical message 'tidewater.ddl' (pg_logical_emit_message(true, ...)) describing the table *after* the
-- command, inside the DDL's transaction and at its WAL position, so the span applies it between the rows
-- before it and the rows after it (upstream/postgres/ddl_decode.py reads it; docs/ddl.md).
--
-- Message: {"v": 1, "tag": command tag, "object_type": ..., "identity": ..., "query": current_query(),
--   "table": tidewater.ddl_describe(oid) (each column with its missing value: the fill of an added column),
--   "before": the same before an ALTER TABLE, when found,
--   "joined": the span publications a CREATE TABLE joined (tidewater.ddl_join),
--   "index": tidewater.ddl_index of the index a CREATE INDEX made}
--   {"v": 1, "tag": "DROP INDEX", "table": ..., "index": the index as it was, "index_dropped": true}
--   {"v": 1, "tag": "DROP TABLE", "dropped": {"oid", "schema", "table"}, "query": ...}   per dropped table
--   {"v": 1, "tag": ..., "error": SQLERRM, "query": ...}       when describing failed (the DDL still runs)
-- tidewater.ddl_describe(oid) holds exactly the catalog facts upstream.postgres.catalog.build_schema reads,
-- so a table described here and one read from the catalog are the same TableSchema.

-- Each column: [name, type oid, typmod, NOT NULL, format_type, default expression, missing value, identity]. The missing
-- value (pg_attribute.attmissingval, as text) is the one value PostgreSQL gave every existing row when a column was
-- added with a non-volatile default (now(), current_user, a constant) without rewriting the table; null when it has
-- none (a table rewrite clears it). The text is rendered under the session settings of every Tidewater upstream
-- connection and of the walsender (upstream.postgres.conn.SESSION_SETTINGS), so it parses as a streamed value does.
CREATE OR REPLACE FUNCTION tidewater.ddl_describe(rel oid) RETURNS json
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' SET DateStyle = 'ISO'
    SET IntervalStyle = 'postgres' SET extra_float_digits = 3 SET bytea_output = 'hex' AS $$
    WITH cols AS (
        SELECT a.attnum, a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod) AS fmt,
               pg_get_expr(d.adbin, d.adrelid) AS def,
               CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END AS missing,
               a.attidentity <> '' AS ident
        FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated IN ('', 's')
    )
    SELECT json_build_object(
        'oid', c.oid, 'schema', n.nspname, 'table', c.relname, 'relkind', c.relkind,
        'persistence', c.relpersistence, 'is_partition', c.relispartition, 'replident', c.relreplident,
        'columns', (SELECT coalesce(json_agg(json_build_array(attname, atttypid, atttypmod, attnotnull, fmt, def, missing, ident)
                                             ORDER BY attnum), '[]') FROM cols),
        'types', (WITH RECURSIVE t(oid) AS (
                      SELECT DISTINCT atttypid FROM cols
                      UNION
                      SELECT x FROM t JOIN pg_type y ON y.oid = t.oid, unnest(ARRAY[y.typelem, y.typbasetype]) x
                      WHERE x <> 0)
                  SELECT json_agg(json_build_array(y.oid, y.typname, y.typtype, y.typcategory, y.typelem,
                                                   y.typbasetype, y.typtypmod, y.typnamespace,
                                                   CASE WHEN y.typtype = 'd' THEN format_type(y.typbasetype, y.typtypmod) END))
                  FROM t JOIN pg_type y ON y.oid = t.oid),
        'pk', (SELECT coalesce(json_agg(a.attname ORDER BY k.pos), '[]') FROM pg_index i
               CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE i.indrelid = rel AND i.indisprimary),
        'pk_immediate', coalesce((SELECT i.indimmediate FROM pg_index i WHERE i.indrelid = rel AND i.indisprimary), false),
        'ident', (SELECT coalesce(json_agg(a.attname ORDER BY k.pos), '[]') FROM pg_index i
                  CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos)
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  WHERE i.indrelid = rel AND i.indisreplident))
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = rel
$$;

CREATE OR REPLACE FUNCTION tidewater.ddl_emit(doc json) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_logical_emit_message(true, 'tidewater.ddl', doc::text);
END
$$;

-- CRC-32 (the zlib/IEEE polynomial, as Python's zlib.crc32): the span a table hashes to (cdc.spans.span_of).
CREATE OR REPLACE FUNCTION tidewater.crc32(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    crc bigint := 4294967295;
BEGIN
    FOR i IN 0 .. length(data) - 1 LOOP
        crc := crc # get_byte(data, i);
        FOR k IN 1 .. 8 LOOP
            crc := CASE WHEN (crc & 1) = 1 THEN (crc >> 1) # 3988292384 ELSE crc >> 1 END;
        END LOOP;
    END LOOP;
    RETURN crc # 4294967295;
END
$$;

-- A table just created joins, in its creating transaction, the span publication whose join rule (the
-- publication's comment 'tidewater:{json}', upstream.postgres.admin.join_rule_doc) selects it: the changefeed's
-- filter (anchored regexes, last match wins), the span it hashes to, and no possible clash of downstream names.
-- Its rows are then in the stream from the first one. Only what is surely fine joins here: a plain, permanent,
-- empty table with a usable replica identity and no generated column; anything else (and any error) is left
-- to the owner's look, which applies every check of changefeed create and reports the rows it missed.
-- Returns the publications joined (the DDL message carries them: the span knows at once that it carries it).
CREATE OR REPLACE FUNCTION tidewater.ddl_join(rel oid) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    pub record;
    reg json;
    r json;
    verdict boolean;
    has_pk boolean;
    usable boolean;
    hash bigint;
    joined text[] := '{}';
BEGIN
    SELECT cl.oid, cl.relname, n.nspname, cl.relkind, cl.relpersistence, cl.relispartition, cl.relreplident
      INTO c FROM pg_class cl JOIN pg_namespace n ON n.oid = cl.relnamespace WHERE cl.oid = rel;
    IF c.oid IS NULL OR c.relkind <> 'r' OR c.relpersistence <> 'p' OR c.relispartition
       OR EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = rel AND attnum > 0 AND NOT attisdropped
                  AND attgenerated <> '') THEN
        RETURN joined;
    END IF;
    has_pk := EXISTS (SELECT 1 FROM pg_index WHERE indrelid = rel AND indisprimary);
    usable := CASE c.relreplident  -- (its UPDATEs and DELETEs keep working once it is published)
                  WHEN 'd' THEN EXISTS (SELECT 1 FROM pg_index WHERE indrelid = rel AND indisprimary AND indimmediate)
                  WHEN 'f' THEN true
                  WHEN 'i' THEN EXISTS (SELECT 1 FROM pg_index WHERE indrelid = rel AND indisreplident)
                  ELSE false END;
    IF NOT usable THEN
        RETURN joined;
    END IF;
    hash := tidewater.crc32(convert_to(c.nspname || '.' || c.relname, 'UTF8'));
    FOR pub IN SELECT p.pubname, d.description FROM pg_publication p
               JOIN pg_description d ON d.objoid = p.oid AND d.classoid = 'pg_publication'::regclass AND d.objsubid = 0
               WHERE p.pubname LIKE 'tidewater\_pub\_%' AND NOT p.puballtables AND d.description LIKE 'tidewater:%' LOOP
        reg := substr(pub.description, 11)::json;
        CONTINUE WHEN (reg ->> 'v')::int IS DISTINCT FROM 1;
        CONTINUE WHEN hash % (reg ->> 'spans')::bigint <> (reg ->> 'span')::bigint;
        verdict := false;
        FOR r IN SELECT * FROM json_array_elements(reg -> 'rules') LOOP
            IF c.nspname ~ (r ->> 1) AND c.relname ~ (r ->> 2) THEN
                verdict := (r ->> 0)::boolean;
            END IF;
        END LOOP;
        CONTINUE WHEN NOT verdict;
        CONTINUE WHEN NOT (reg ->> 'keyless')::boolean AND NOT has_pk;
        CONTINUE WHEN reg ->> 'names' <> 'qualified' AND EXISTS (
            SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p2 ON p2.oid = pr.prpubid
            JOIN pg_class x ON x.oid = pr.prrelid
            WHERE p2.pubname IN (SELECT json_array_elements_text(reg -> 'pubs')) AND x.oid <> rel
              AND (x.relname = c.relname OR ((reg ->> 'fold')::boolean AND lower(x.relname) = lower(c.relname))));
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I.%I', pub.pubname, c.nspname, c.relname);
        joined := joined || pub.pubname::text;
    END LOOP;
    RETURN joined;
EXCEPTION WHEN OTHERS THEN
    RETURN '{}';  -- nothing joined (the block's changes are rolled back): the owner's look adds it
END
$$;

-- An index as a sink can replay it ([ddl] replicate-indexes): name, key columns in order (null when one is an
-- expression), uniqueness, and whether it is partial or the primary key (neither is replayed as an index).
CREATE OR REPLACE FUNCTION tidewater.ddl_index(idx oid) RETURNS json
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT json_build_object(
        'name', c.relname, 'unique', i.indisunique, 'primary', i.indisprimary, 'partial', i.indpred IS NOT NULL,
        'columns', CASE WHEN i.indexprs IS NULL THEN
                       (SELECT json_agg(a.attname ORDER BY k.pos)
                        FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos)
                        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                        WHERE k.pos <= i.indnkeyatts) END)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indexrelid = idx
$$;

-- Before an ALTER TABLE runs, the tables it names (a published table whose name appears in the statement)
-- are described, so that the message can carry the table *before* the command too: the span then needs no
-- earlier schema of its own (after a restart, the stream may have none). A table not found that way is
-- compared with the span's last schema of it.
CREATE OR REPLACE FUNCTION tidewater.ddl_start() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    IF TG_TAG = 'DROP INDEX' THEN  -- sql_drop sees the index gone: what it was, and on which table, is kept here
        PERFORM set_config('tidewater.ddl_indexes', coalesce((
            SELECT json_object_agg(i.indexrelid::text, json_build_object('rel', i.indrelid,
                                                                          'index', tidewater.ddl_index(i.indexrelid)))::text
            FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
            WHERE i.indrelid IN (SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                                 WHERE p.pubname LIKE 'tidewater\_pub\_%')
              AND position(lower(ic.relname) IN lower(current_query())) > 0), ''), false);
        RETURN;
    END IF;
    PERFORM set_config('tidewater.ddl_before', coalesce((
        SELECT json_object_agg(c.oid::text, tidewater.ddl_describe(c.oid))::text
        FROM pg_class c
        WHERE c.oid IN (SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                        WHERE p.pubname LIKE 'tidewater\_pub\_%')
          AND position(lower(c.relname) IN lower(current_query())) > 0), ''), false);
EXCEPTION WHEN OTHERS THEN
    PERFORM set_config('tidewater.ddl_before', '', false);
    PERFORM set_config('tidewater.ddl_indexes', '', false);
END
$$;

-- The messages are emitted *outside* the EXCEPTION blocks: a message emitted inside a subtransaction is
-- decoded after the rest of the transaction (measured on PostgreSQL 18.6), i.e. after rows written later
-- than it. The blocks only read the catalog, so they never assign a subtransaction id.
CREATE OR REPLACE FUNCTION tidewater.ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cmd record;
    done oid[] := '{}';
    rel oid;
    docs json[] := '{}';
    doc json;
    befores json;
    joined text[];
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    BEGIN
        befores := nullif(current_setting('tidewater.ddl_before', true), '')::json;
        PERFORM set_config('tidewater.ddl_before', '', false);
        FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
            CONTINUE WHEN cmd.classid <> 'pg_catalog.pg_class'::regclass OR cmd.in_extension;
            SELECT CASE WHEN c.relkind IN ('r', 'p') THEN c.oid WHEN c.relkind IN ('i', 'I') THEN
                        (SELECT indrelid FROM pg_index WHERE indexrelid = c.oid) END
              INTO rel FROM pg_class c WHERE c.oid = cmd.objid;
            CONTINUE WHEN rel IS NULL OR rel = ANY (done);
            done := done || rel;
            CONTINUE WHEN (SELECT relpersistence = 't' OR relnamespace IN ('pg_catalog'::regnamespace,
                                   'information_schema'::regnamespace, 'tidewater'::regnamespace)
                           FROM pg_class WHERE oid = rel);
            joined := CASE WHEN cmd.command_tag = 'CREATE TABLE' AND cmd.object_type = 'table'
                           THEN tidewater.ddl_join(rel) ELSE '{}' END;
            docs := docs || json_build_object(
                'v', 1, 'tag', cmd.command_tag, 'object_type', cmd.object_type, 'identity', cmd.object_identity,
                'query', current_query(), 'table', tidewater.ddl_describe(rel), 'before', befores -> rel::text,
                'joined', joined,
                'index', CASE WHEN cmd.command_tag = 'CREATE INDEX' AND cmd.object_type = 'index'
                              THEN tidewater.ddl_index(cmd.objid) END);
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        docs := ARRAY[json_build_object('v', 1, 'tag', TG_TAG, 'error', SQLERRM, 'query', current_query())];
    END;
    FOREACH doc IN ARRAY docs LOOP
        PERFORM tidewater.ddl_emit(doc);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION tidewater.ddl_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    obj record;
    docs json[] := '{}';
    doc json;
    dropped json;
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    BEGIN
        IF TG_TAG = 'DROP INDEX' THEN
            dropped := nullif(current_setting('tidewater.ddl_indexes', true), '')::json;
            PERFORM set_config('tidewater.ddl_indexes', '', false);
            FOR obj IN SELECT * FROM pg_event_trigger_dropped_objects() WHERE object_type = 'index' LOOP
                CONTINUE WHEN dropped IS NULL OR dropped -> obj.objid::text IS NULL;
                docs := docs || json_build_object(
                    'v', 1, 'tag', TG_TAG, 'object_type', 'index', 'query', current_query(),
                    'table', tidewater.ddl_describe((dropped -> obj.objid::text ->> 'rel')::oid),
                    'index', dropped -> obj.objid::text -> 'index', 'index_dropped', true);
            END LOOP;
        END IF;
        FOR obj IN SELECT * FROM pg_event_trigger_dropped_objects()
                   WHERE object_type = 'table' AND NOT is_temporary
                     AND schema_name NOT IN ('pg_catalog', 'information_schema', 'tidewater') LOOP
            docs := docs || json_build_object(
                'v', 1, 'tag', TG_TAG, 'query', current_query(),
                'dropped', json_build_object('oid', obj.objid, 'schema', obj.schema_name, 'table', obj.object_name));
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        docs := ARRAY[json_build_object('v', 1, 'tag', TG_TAG, 'error', SQLERRM, 'query', current_query())];
    END;
    FOREACH doc IN ARRAY docs LOOP
        PERFORM tidewater.ddl_emit(doc);
    END LOOP;
END
$$;

DROP EVENT TRIGGER IF EXISTS tidewater_ddl_start;
CREATE EVENT TRIGGER tidewater_ddl_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE', 'DROP INDEX')
    EXECUTE FUNCTION tidewater.ddl_start();
ALTER EVENT TRIGGER tidewater_ddl_start ENABLE ALWAYS;

DROP EVENT TRIGGER IF EXISTS tidewater_ddl_end;
CREATE EVENT TRIGGER tidewater_ddl_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'CREATE INDEX', 'ALTER INDEX')
    EXECUTE FUNCTION tidewater.ddl_end();
ALTER EVENT TRIGGER tidewater_ddl_end ENABLE ALWAYS;

DROP EVENT TRIGGER IF EXISTS tidewater_ddl_drop;
CREATE EVENT TRIGGER tidewater_ddl_drop ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED', 'DROP INDEX')
    EXECUTE FUNCTION tidewater.ddl_drop();
ALTER EVENT TRIGGER tidewater_ddl_drop ENABLE ALWAYS;
