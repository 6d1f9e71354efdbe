"""Views of a run for people: the self-contained HTML report and live terminal progress.

Pure renderers over the api's JSON views (`RunView`, `RunGraph`, `EventView`):
nothing here opens the journal except `akm.report.watch`, which polls it through
`akm.api` like any other front would. Imported only by the commands that render.
"""
