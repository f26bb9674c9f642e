-- Audit queries by time window (operators, retention by age) without a scan.

-- +goose Up
CREATE INDEX admin_audit_at ON admin_audit (at);

-- +goose Down
DROP INDEX admin_audit_at;
