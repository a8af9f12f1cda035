-- DDL in the stream (issue 9): after every command that creates, alters or drops a table, a transactional
-- logical message 'tidewater.ddl' (pg_logical_emit_message(true, ...)) describing the table *after* the
-- command, inside the DDL's transaction and at its WAL position, so the span applies it between the rows
-- before it and the rows after it (upstream/postgres/ddl_decode.py reads it; docs/ddl.md).
--
-- Message: {"v": 1, "tag": command tag, "object_type": ..., "identity": ..., "query": current_query(),
--   "table": tidewater.ddl_describe(oid), "before": the same before an ALTER TABLE, when found}
--   {"v": 1, "tag": "DROP TABLE", "dropped": {"oid", "schema", "table"}, "query": ...}   per dropped table
--   {"v": 1, "tag": ..., "error": SQLERRM, "query": ...}       when describing failed (the DDL still runs)
-- tidewater.ddl_describe(oid) holds exactly the catalog facts upstream.postgres.catalog.build_schema reads,
-- so a table described here and one read from the catalog are the same TableSchema.

CREATE OR REPLACE FUNCTION tidewater.ddl_describe(rel oid) RETURNS json
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH cols AS (
        SELECT a.attnum, a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod) AS fmt,
               pg_get_expr(d.adbin, d.adrelid) AS def
        FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated IN ('', 's')
    )
    SELECT json_build_object(
        'oid', c.oid, 'schema', n.nspname, 'table', c.relname, 'relkind', c.relkind,
        'persistence', c.relpersistence, 'is_partition', c.relispartition, 'replident', c.relreplident,
        'columns', (SELECT coalesce(json_agg(json_build_array(attname, atttypid, atttypmod, attnotnull, fmt, def)
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
    PERFORM set_config('tidewater.ddl_before', coalesce((
        SELECT json_object_agg(c.oid::text, tidewater.ddl_describe(c.oid))::text
        FROM pg_class c
        WHERE c.oid IN (SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                        WHERE p.pubname LIKE 'tidewater\_pub\_%')
          AND position(lower(c.relname) IN lower(current_query())) > 0), ''), false);
EXCEPTION WHEN OTHERS THEN
    PERFORM set_config('tidewater.ddl_before', '', false);
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
            docs := docs || json_build_object(
                'v', 1, 'tag', cmd.command_tag, 'object_type', cmd.object_type, 'identity', cmd.object_identity,
                'query', current_query(), 'table', tidewater.ddl_describe(rel), 'before', befores -> rel::text);
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
BEGIN
    IF coalesce(current_setting('tidewater.internal', true), '') = 'on' THEN
        RETURN;
    END IF;
    BEGIN
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
    WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION tidewater.ddl_start();
ALTER EVENT TRIGGER tidewater_ddl_start ENABLE ALWAYS;

DROP EVENT TRIGGER IF EXISTS tidewater_ddl_end;
CREATE EVENT TRIGGER tidewater_ddl_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'CREATE INDEX', 'ALTER INDEX')
    EXECUTE FUNCTION tidewater.ddl_end();
ALTER EVENT TRIGGER tidewater_ddl_end ENABLE ALWAYS;

DROP EVENT TRIGGER IF EXISTS tidewater_ddl_drop;
CREATE EVENT TRIGGER tidewater_ddl_drop ON sql_drop
    WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION tidewater.ddl_drop();
ALTER EVENT TRIGGER tidewater_ddl_drop ENABLE ALWAYS;
