"""The spec language in which methods, codecs, models and data sources declare their parameters
(plain data, see specs.schema), with the one validator every layer uses: scenario files above,
a site checking a request's fields below."""
