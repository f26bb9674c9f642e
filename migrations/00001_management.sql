-- Management state of a fleet (seed 000 §12.1, §12.3). Proxy addresses,
-- credentials, lifecycles, worker ownership and extraction records live in
-- Redis only and never appear here.

-- +goose Up
CREATE TABLE config_revisions (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL,
    fingerprint text        NOT NULL CHECK (length(fingerprint) <= 200),
    source      text        NOT NULL CHECK (length(source) <= 4096)
);

CREATE TABLE upstream_admin (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 1024),
    enabled    boolean     NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE routing_cursors (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 1024),
    idx        integer     NOT NULL,
    generation bigint      NOT NULL,
    exhausted  boolean     NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE admin_audit (
    id     bigserial   PRIMARY KEY,
    at     timestamptz NOT NULL,
    actor  text        NOT NULL,
    action text        NOT NULL,
    target text        NOT NULL,
    result text        NOT NULL
);

-- The outbox is written in the transaction of each management change;
-- controllers are woken by NOTIFY proxypool_outbox and read it in id order.
CREATE TABLE management_outbox (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL,
    topic        text        NOT NULL,
    subject      text        NOT NULL,
    payload      jsonb       NOT NULL,
    published_at timestamptz
);
CREATE INDEX management_outbox_unpublished ON management_outbox (id) WHERE published_at IS NULL;

-- +goose Down
DROP TABLE management_outbox;
DROP TABLE admin_audit;
DROP TABLE routing_cursors;
DROP TABLE upstream_admin;
DROP TABLE config_revisions;
