SELECT (EXISTS (SELECT FROM pg_catalog.pg_listening_channels()) OR EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable))::pg_catalog.text;
